"""Fuzzing the envelope decoders (issue 18): Flower content -> Envelope, riders, the
secure-aggregation frame, and the typed field readers.

Every input is either the protobuf bytes of a valid message, mutated (bit flips,
truncation, extension, overwrites, splices), random bytes, or a valid Envelope whose
fields were mutated (wrong types, huge numbers, NaN/Inf, wrong dtypes and shapes, fields
dropped, added, swapped or renamed). Our decoders may only raise `MessageError` or
`SecAggProtocolError` (both ValueErrors with a message), within a time bound per message.
What Flower's own protobuf layer refuses before our code runs is counted, not judged.

FEDVEIL_FUZZ_MESSAGES sets the messages per test, FEDVEIL_FUZZ_SEED replays a run.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common import serde
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from fuzzing import FuzzRun, fuzz_count, fuzz_seed, mutate_bytes, mutated_messages, random_bytes
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from fedveil.privacy.secagg import SecAggProtocolError, SessionConfig, run_in_memory
from fedveil.privacy.secagg.messages import Message, Stage, decode_message
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import from_content, to_content
from fedveil.protocol.kinds import Kind
from fedveil.protocol.piggyback import attach, detach, latest_round, split_reply
from fedveil.protocol.secagg_frame import protocol_part, wrap

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

DEFAULT_MESSAGES = 10_000
DECLARED = (MessageError, SecAggProtocolError)
MODEL_SIZE = 12


def _secagg_envelopes() -> list[Envelope]:
    """Every secure-aggregation message of a real round, framed as a transport frames it."""
    session = SessionConfig.create(
        range(5), dimension=8, modulus_bits=32, run_id=b"fuzz-run", round=4
    )
    out: list[Envelope] = []

    def down(stage: Stage, cid: int, msg: Message) -> Message:
        out.append(wrap(Kind.secagg(stage), session.round, msg))
        return msg

    def up(stage: Stage, cid: int, msg: Message) -> tuple[Message, ...]:
        out.append(wrap(Kind.secagg(stage), session.round, msg))
        return (msg,)

    inputs = {cid: np.arange(8, dtype=np.uint32) for cid in session.client_ids}
    run_in_memory(session, inputs, tamper_down=down, tamper_up=up)
    return out


def _valid_envelopes() -> list[Envelope]:
    model = np.linspace(-1, 1, MODEL_SIZE, dtype=np.float32)
    train = Envelope(
        Kind.TRAIN,
        3,
        {
            F.SEED: 7,
            F.LOCAL_EPOCHS: 1,
            F.BATCH_SIZE: 8,
            F.LR: 0.1,
            F.MOMENTUM: 0.0,
            F.CLIP_NORM: 1.0,
            F.LEDGER_HEAD: '{"head": "x"}',
        },
        {F.MODEL: model},
    )
    reply = Envelope(
        Kind.TRAIN, 3, {F.NUM_EXAMPLES: 32, F.LOSS: 0.5, F.STEPS: 4}, {F.DELTA: model * 0.1}
    )
    hello = Envelope(Kind.HELLO, 0, {F.CLIENT_ID: 2, F.SIZE: MODEL_SIZE})
    secagg = _secagg_envelopes()
    with_rider = attach(train, secagg[0])
    return [train, reply, hello, with_rider, *secagg]


def _consume(env: Envelope) -> None:
    """What a server or client reads from a peer's Envelope; each reader's declared errors
    are expected and swallowed, so every reader sees every message."""
    readers = [
        lambda: latest_round(env.round, env.config),
        lambda: detach(env),
        lambda: split_reply(env, Envelope(Kind.SECAGG_ADVERTISE, env.round + 1)),
        lambda: decode_message(*protocol_part(env)),
        lambda: env.tensor(F.MODEL),
        lambda: env.tensor(F.DELTA, numel=MODEL_SIZE),
        *(lambda k=key, t=kind: env.get(k, t) for key, kind in F.HYPERPARAMETERS),
        lambda: env.get(F.CLIENT_ID, int),
        lambda: env.get(F.LOSS, (int, float)),
    ]
    for read in readers:
        try:
            read()
        except DECLARED as exc:
            assert str(exc), f"{type(exc).__name__} without a message"
    primary, rider = detach(env) if _detaches(env) else (env, None)
    if rider is not None:
        for part in (primary, rider):
            with contextlib.suppress(DECLARED):
                decode_message(*protocol_part(part))


def _detaches(env: Envelope) -> bool:
    try:
        detach(env)
    except MessageError:
        return False
    return True


def _flower_decode(raw: bytes) -> Any:
    """Flower's own decoding of the content bytes (before any fedveil code runs); None when
    Flower refuses them."""
    proto = ProtoRecordDict()
    try:
        proto.ParseFromString(raw)
        return serde.recorddict_from_proto(proto)
    except (DecodeError, ValueError, TypeError, AttributeError, KeyError):
        return None


def _with_mutated_array(run: FuzzRun, content: RecordDict) -> RecordDict:
    """`content` with one array's .npy bytes (header or data) mutated."""
    arrays = content["arrays"]
    assert isinstance(arrays, ArrayRecord)
    key = run.rng.choice(list(arrays))
    array = arrays[key]
    data = array.data
    for _ in range(run.rng.randrange(1, 3)):
        data = mutate_bytes(run.rng, data)
    mutated = ArrayRecord({**arrays, key: Array(array.dtype, array.shape, array.stype, data)})
    return RecordDict({"meta": content["meta"], "config": content["config"], "arrays": mutated})


def test_fuzz_flower_content_bytes(record_property: Any) -> None:
    """Mutated and random protobuf bytes of messages, through Flower's parser into ours."""
    contents = [to_content(env) for env in _valid_envelopes()]
    contents = [c for c in contents if len(c["arrays"])]
    valid = [serde.recorddict_to_proto(c).SerializeToString() for c in contents]
    run = FuzzRun("envelope_bytes", fuzz_count(DEFAULT_MESSAGES), fuzz_seed(), record_property)
    rng = run.rng
    flower_refused = 0
    with warnings.catch_warnings():  # numpy warns about odd .npy headers it still reads
        warnings.simplefilter("ignore", UserWarning)
        for i in range(run.count):
            if rng.random() < 0.4:  # a well-formed protobuf carrying a mutated .npy array
                content = _with_mutated_array(run, rng.choice(contents))
                raw = b"(an array mutated inside a valid message)"
            else:
                raw = random_bytes(rng, 400) if rng.random() < 0.1 else rng.choice(valid)
                for _ in range(rng.randrange(1, 4)):
                    raw = mutate_bytes(rng, raw)
                content = _flower_decode(raw)
            if content is None:
                flower_refused += 1
                continue
            run.feed(
                i,
                lambda c=content: _consume(from_content(c)),
                (MessageError,),
                lambda r=raw: repr(r),
            )
    run.outcomes["refused by Flower's parser"] = flower_refused
    run.report()
    assert run.outcomes.get("accepted", 0) > 0 and run.outcomes.get("MessageError", 0) > 0


def test_fuzz_envelope_fields(record_property: Any) -> None:
    """Valid Envelopes with mutated fields, through every reader of a peer's Envelope."""
    envelopes = _valid_envelopes()
    valid = [(dict(e.config), dict(e.arrays)) for e in envelopes]
    run = FuzzRun("envelope_fields", fuzz_count(DEFAULT_MESSAGES), fuzz_seed(), record_property)
    for i, (config, arrays) in enumerate(mutated_messages(run, valid)):
        rng = run.rng
        kind = rng.choice([e.kind for e in envelopes]) if rng.random() < 0.9 else "secagg.x"
        round_num = rng.choice((0, 3, 4, -1, 2**63, 2**64 + 1))
        env = Envelope(kind, round_num, config, arrays)
        run.feed(i, lambda e=env: _consume(e), DECLARED, lambda e=env: repr(e))
    run.report()


def test_fuzz_flower_round_trip_of_fuzzed_fields(record_property: Any) -> None:
    """Mutated Envelopes that Flower can carry arrive as they were sent, or are refused by
    name: the codec never changes a value on the way."""
    envelopes = _valid_envelopes()
    valid = [(dict(e.config), dict(e.arrays)) for e in envelopes]
    count = max(1, fuzz_count(DEFAULT_MESSAGES) // 4)
    run = FuzzRun("envelope_round_trip", count, fuzz_seed(), record_property)
    for i, (config, arrays) in enumerate(mutated_messages(run, valid)):
        try:
            content = to_content(Envelope(Kind.TRAIN, 1, config, arrays))
        except Exception:  # a value Flower cannot carry never reaches a peer
            run.outcomes["not sendable"] = run.outcomes.get("not sendable", 0) + 1
            continue
        got = run.feed(
            i, lambda c=content: from_content(c), (MessageError,), lambda c=config: repr(c)
        )
        if got is not None:
            assert got.config.keys() == config.keys(), run.replay_hint(i)
            for key, value in arrays.items():
                # Flower carries a 0-d array as a 1-element vector; values and dtype stay.
                sent, arrived = np.asarray(value), got.arrays[key]
                assert arrived.dtype == sent.dtype, run.replay_hint(i)
                np.testing.assert_array_equal(
                    arrived.reshape(-1), sent.reshape(-1), err_msg=run.replay_hint(i)
                )
    run.report()


_config_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=20),
    st.binary(max_size=40),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
    st.lists(st.floats(), max_size=4),
)
_dtypes = st.sampled_from(["float32", "float64", "float16", "int32", "uint8", ">f4", "bool"])


def _filled(dtype: str, shape: tuple[int, ...], fill: float) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN and 1e39 into ints and float16 on purpose
        return np.full(shape, fill).astype(dtype)


_arrays = st.builds(
    _filled,
    _dtypes,
    st.sampled_from([(), (0,), (MODEL_SIZE,), (3, 4), (MODEL_SIZE + 1,)]),
    st.sampled_from([0.0, 1.5, math.nan, math.inf, -math.inf, 1e39]),
)


@settings(max_examples=400, deadline=2000)
@given(
    config=st.dictionaries(
        st.sampled_from([F.LR, F.SEED, F.CLIENT_ID, F.LOSS, "rider:kind", "rider:round", "x"]),
        _config_values,
        max_size=5,
    ),
    arrays=st.dictionaries(st.sampled_from([F.MODEL, F.DELTA, "rider.sa.x"]), _arrays, max_size=3),
)
def test_hypothesis_envelope_readers(config: dict[str, Any], arrays: dict[str, Any]) -> None:
    """Structured inputs (Hypothesis): typed readers refuse by name, accept only what they
    promise (a finite float32 vector of the right length, a value of the asked type)."""
    env = Envelope(Kind.TRAIN, 1, config, arrays)
    _consume(env)
    for key in (F.MODEL, F.DELTA):
        try:
            t = env.tensor(key, numel=MODEL_SIZE)
        except MessageError as exc:
            assert key in str(exc)
        else:
            assert t.numel() == MODEL_SIZE and bool(t.isfinite().all())


def test_malformed_arrays_are_message_errors_naming_the_array() -> None:
    """Regressions found by the fuzz: each raised TypeError, ValueError, EOFError or
    tokenize.TokenError before, which callers catching MessageError did not expect."""
    for bad in (np.array([1, 2], dtype=object), np.array([1.0], dtype=">f4"), np.array(["a"])):
        with pytest.raises(MessageError, match="'model' has dtype"):
            Envelope(Kind.TRAIN, 1, {}, {F.MODEL: bad}).tensor(F.MODEL)
    content = to_content(Envelope(Kind.TRAIN, 1, {}, {F.MODEL: np.ones(4, np.float32)}))
    array = content["arrays"][F.MODEL]
    for data in (array.data[:-3], array.data[:20], array.data.replace(b"(4,)", b"(9,)")):
        broken = ArrayRecord({F.MODEL: Array(array.dtype, array.shape, array.stype, data)})
        content = RecordDict(
            {"meta": content["meta"], "config": content["config"], "arrays": broken}
        )
        with pytest.raises(MessageError, match="'model' cannot be decoded"):
            from_content(content)
    ragged = Envelope(Kind.SECAGG_MASKED_INPUT, 1, {}, {"sa.masked_vector": [[1], [1, 2]]})
    with pytest.raises(SecAggProtocolError):
        decode_message(*protocol_part(ragged))
