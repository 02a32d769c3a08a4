"""Fuzzing the secure-aggregation decoders and the server session that consumes them (issue 18).

Random and mutated messages of every type (both directions, semi-honest and malicious mode)
go through `decode_message` and, when they decode, into a live `SecAggServer` in the middle
of a round. Only `SecAggProtocolError` (with a message) may come out, each call within a time
bound, and a rejected message must leave the session as it was apart from dropping its
sender: the round then completes with the honest clients and the exact sum of their inputs.

FEDVEIL_FUZZ_MESSAGES sets the messages per test (default sized for CI), FEDVEIL_FUZZ_SEED
replays a run; both are printed and reported (see tests/fuzzing.py).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzzing import FuzzRun, fuzz_count, fuzz_seed, mutate_bytes, mutated_messages
from secagg_helpers import make_session, plain_sum, random_inputs

from fedveil.privacy.secagg import (
    SecAggAborted,
    SecAggClient,
    SecAggError,
    SecAggProtocolError,
    SecAggServer,
    ThreatMode,
    run_in_memory,
)
from fedveil.privacy.secagg.messages import Message, Stage, decode_message
from fedveil.privacy.secagg.session import SessionConfig
from fedveil.privacy.secagg.shamir import PRIME, SHARE_BYTES, decode_share
from fedveil.privacy.secagg.view import SessionView, session_from_bytes
from fedveil.privacy.secagg.wire import decode_members

DEFAULT_DECODER_MESSAGES = 20_000
DEFAULT_SESSION_MESSAGES = 3_000
PER_STAGE = 150  # fuzzed messages a victim sends in each stage of a round

Wire = tuple[dict[str, Any], dict[str, np.ndarray]]
Keys = dict[int, Ed25519PrivateKey] | None


def _identity(session: SessionConfig) -> dict[int, Ed25519PrivateKey]:
    return {cid: Ed25519PrivateKey.generate() for cid in session.client_ids}


def _sessions() -> list[tuple[SessionConfig, dict[int, Ed25519PrivateKey] | None]]:
    semi = make_session(5, dimension=8)
    malicious = make_session(5, dimension=8, mode=ThreatMode.MALICIOUS, bits=40)
    return [(semi, None), (malicious, _identity(malicious))]


def _valid_messages() -> list[Wire]:
    """The wire form of every message of a real round, both directions, both modes."""
    seen: list[Wire] = []

    def down(stage: Stage, cid: int, msg: Message) -> Message:
        seen.append(msg.to_wire())
        return msg

    def up(stage: Stage, cid: int, msg: Message) -> tuple[Message, ...]:
        seen.append(msg.to_wire())
        return (msg,)

    for session, keys in _sessions():
        run_in_memory(
            session, random_inputs(session, 1), identity_keys=keys, tamper_down=down, tamper_up=up
        )
    return [(dict(c), dict(a)) for c, a in seen]


def test_fuzz_decode_message(record_property: Any) -> None:
    """Every message type: only SecAggProtocolError, never a crash or a slow call."""
    valid = _valid_messages()
    assert {c["msg"] for c, _ in valid} >= {
        "advertise_request",
        "advertise_keys",
        "share_keys_request",
        "share_keys",
        "masked_input_request",
        "masked_input",
        "consistency_request",
        "consistency_signature",
        "unmask_request",
        "unmask_shares",
    }
    run = FuzzRun(
        "secagg_decode", fuzz_count(DEFAULT_DECODER_MESSAGES), fuzz_seed(), record_property
    )
    for i, (config, arrays) in enumerate(mutated_messages(run, valid)):
        run.feed(
            i,
            lambda c=config, a=arrays: decode_message(c, a),
            (SecAggProtocolError,),
            lambda c=config, a=arrays: f"config={c!r} arrays={a!r}",
        )
    run.report()
    # The mutations must reach the checks, not only bounce off the message tag.
    assert run.outcomes.get("accepted", 0) > 0
    assert run.outcomes.get("SecAggProtocolError", 0) > run.count // 2


def test_fuzz_shares_bitmaps_and_stored_sessions(record_property: Any) -> None:
    """Shamir share encodings, survivor bitmaps and stored sessions (config and view)."""
    session = make_session(7, dimension=8)
    holder = session.client_ids[0]
    view = SessionView.of(session, holder, session.neighbours_of(holder))
    stored = [session.to_bytes(), view.to_bytes()]
    run = FuzzRun(
        "secagg_shares", fuzz_count(DEFAULT_DECODER_MESSAGES), fuzz_seed(), record_property
    )
    rng = run.rng
    good_share = (PRIME - 1).to_bytes(SHARE_BYTES, "big")
    for i in range(run.count):
        part = i % 3
        if part == 0:
            raw = mutate_bytes(rng, good_share) if rng.random() < 0.8 else rng.randbytes(40)
            value = run.feed(i, lambda r=raw: decode_share(r), (), lambda r=raw: repr(r))
            assert value is None or (len(raw) == SHARE_BYTES and 0 <= value < PRIME), raw
        elif part == 1:
            bitmap = mutate_bytes(rng, b"\x7f")
            run.feed(
                i,
                lambda b=bitmap: decode_members("survivors", b, session.ids_array),
                (SecAggProtocolError,),
                lambda b=bitmap: repr(b),
            )
        else:
            raw = mutate_bytes(rng, rng.choice(stored))
            run.feed(
                i,
                lambda r=raw: session_from_bytes(r),
                (SecAggProtocolError,),
                lambda r=raw: repr(r),
            )
    run.report()


def _fingerprint(server: SecAggServer) -> tuple[Any, ...]:
    """Everything a reply can change, except the record of who was dropped."""
    r = server._round
    return (
        server.phase,
        server._asked,
        frozenset(server._replied),
        repr(sorted(r.adverts.items())),
        frozenset(r.used_keys),
        r.u1,
        repr(sorted((k, list(v)) for k, v in r.inbox.items())),
        r.u2,
        repr(sorted(r.forwarded.items())),
        repr(sorted(r.accepted_shares.items())),
        None if r.total is None else r.total.tobytes(),
        r.u3,
        r.survivors_bitmap,
        repr(sorted(r.signatures.items())),
        r.responders,
        repr(sorted((k, list(v)) for k, v in r.seed_points.items())),
        repr(sorted((k, list(v)) for k, v in r.key_points.items())),
        repr(sorted(r.x_to_client.items())),
    )


class _FuzzingVictim:
    """A `tamper_up` hook: the victim's reply at each stage is preceded by PER_STAGE fuzzed
    ones (mutations of it), fed to the decoder and, if they decode, to the live server."""

    def __init__(self, run: FuzzRun, server: SecAggServer, victim: int, fed: int) -> None:
        self.run, self.server, self.victim, self.fed = run, server, victim, fed
        self.accepted: list[str] = []  # stages where a mutation was still a valid message

    def __call__(self, stage: Stage, cid: int, reply: Message) -> tuple[Message, ...]:
        if cid != self.victim or self.accepted:
            return (reply,)
        wire = [tuple(dict(part) for part in reply.to_wire())]
        for config, arrays in mutated_messages(_Slice(self.run, PER_STAGE), wire):  # type: ignore[arg-type]
            self.fed += 1
            if self._one(stage, config, arrays) == "ok":
                self.accepted.append(stage.value)
                return ()
        return (reply,)

    def _one(self, stage: Stage, config: dict[str, Any], arrays: dict[str, Any]) -> str | None:
        run, server, hint = self.run, self.server, self.run.replay_hint(self.fed)

        def shown() -> str:
            return f"{stage}: config={config!r} arrays={arrays!r}"

        msg = run.feed(
            self.fed, lambda: decode_message(config, arrays), (SecAggProtocolError,), shown
        )
        if msg is None:
            return None  # dropped by the decoder: the server never sees it
        before = _fingerprint(server)
        outcome = run.feed(
            self.fed,
            lambda: server.receive(self.victim, msg) or "ok",
            (SecAggProtocolError,),
            shown,
        )
        if outcome != "ok":
            assert _fingerprint(server) == before, f"{hint}: state changed at {stage}"
            assert self.victim in server._failed, f"{hint}: sender not dropped at {stage}"
            # Undo the drop so that the next fuzzed message meets the same state.
            server._failed.discard(self.victim)
        return outcome


@pytest.mark.parametrize("mode", [ThreatMode.SEMI_HONEST, ThreatMode.MALICIOUS])
def test_fuzz_server_session_drops_only_the_sender(mode: ThreatMode, record_property: Any) -> None:
    """A victim client sends fuzzed replies at every stage, mid-stage. Each rejected one
    changes nothing but dropping its sender; the round then completes with the honest
    clients and the exact sum of their inputs."""
    count = fuzz_count(DEFAULT_SESSION_MESSAGES)
    run = FuzzRun(f"secagg_session_{mode.value}", count, fuzz_seed(), record_property)
    session, keys = _sessions()[0 if mode is ThreatMode.SEMI_HONEST else 1]
    public = {c: k.public_key() for c, k in keys.items()} if keys else None
    fed = rounds = 0
    while fed < count:
        rounds += 1
        inputs = random_inputs(session, run.rng.randrange(2**32))
        server = SecAggServer(session, identity_public_keys=public)
        hook = _FuzzingVictim(run, server, run.rng.choice(session.client_ids), fed)
        try:
            report = run_in_memory(
                session, inputs, identity_keys=keys, tamper_up=hook, server=server
            )
        except SecAggAborted as exc:
            assert hook.accepted, f"{run.replay_hint(hook.fed)}: honest round aborted: {exc}"
            continue
        finally:
            fed = hook.fed
        survivors = report.result.survivors
        assert frozenset(session.client_ids) - {hook.victim} <= survivors, run.replay_hint(fed)
        if not hook.accepted:
            expected = plain_sum(inputs, survivors, session.modulus_bits)
            np.testing.assert_array_equal(
                report.result.total.astype(np.uint64), expected, err_msg=run.replay_hint(fed)
            )
    record_property("fuzz_session_rounds", rounds)
    print(f"[fuzz {run.family}] {rounds} rounds completed")
    run.report(messages=fed)


class _Slice:
    """`run` with a smaller count: the mutation stream of one stage."""

    def __init__(self, run: FuzzRun, count: int) -> None:
        self.rng, self.count = run.rng, count


def _client_copy(
    cid: int, request: Message, client: SecAggClient | None, keys: Keys
) -> SecAggClient:
    """What a client process does with a request: a fresh client for an advertisement,
    else the client restored from its saved state (so the real one stays untouched)."""
    key = keys[cid] if keys else None
    public = {c: k.public_key() for c, k in keys.items()} if keys else None
    if client is None:
        session = getattr(request, "session", None)
        if session is None:
            raise SecAggProtocolError("no session in progress")
        return SecAggClient(cid, session, identity_key=key, identity_public_keys=public)
    return SecAggClient.from_state(client.to_state(), identity_key=key, identity_public_keys=public)


@pytest.mark.parametrize("mode", [ThreatMode.SEMI_HONEST, ThreatMode.MALICIOUS])
def test_fuzz_client_refuses_fuzzed_requests(mode: ThreatMode, record_property: Any) -> None:
    """A client holding a live round's state gets fuzzed server requests at every stage:
    only SecAggError may come out (a refusal or an abort), and the round then completes
    with the genuine requests and the exact sum."""
    count = fuzz_count(DEFAULT_SESSION_MESSAGES)
    run = FuzzRun(f"secagg_client_{mode.value}", count, fuzz_seed(), record_property)
    session, keys = _sessions()[0 if mode is ThreatMode.SEMI_HONEST else 1]
    public = {c: k.public_key() for c, k in keys.items()} if keys else None
    fed = rounds = 0
    while fed < count:
        rounds += 1
        inputs = random_inputs(session, run.rng.randrange(2**32))
        victim = run.rng.choice(session.client_ids)
        server = SecAggServer(session, identity_public_keys=public)
        clients: dict[int, SecAggClient] = {}
        requests = server.next_requests()
        while requests:
            stage = next(iter(requests.values())).STAGE
            for cid, request in requests.items():
                vector = inputs[cid] if stage is Stage.MASKED_INPUT else None
                if cid == victim:
                    wire = [tuple(dict(part) for part in request.to_wire())]
                    for config, arrays in mutated_messages(_Slice(run, PER_STAGE), wire):  # type: ignore[arg-type]
                        fed += 1
                        run.feed(
                            fed,
                            functools.partial(
                                _respond_fuzzed, config, arrays, cid, clients.get(cid), keys, vector
                            ),
                            (SecAggError,),
                            functools.partial(repr, (stage, config, arrays)),
                        )
                client = clients.get(cid) or _client_copy(cid, request, None, keys)
                clients[cid] = client
                server.receive(
                    cid, client.respond(request, None if vector is None else vector.copy())
                )
            requests = server.next_requests()
        result = server.finalize()
        assert result.survivors == frozenset(session.client_ids), run.replay_hint(fed)
        expected = plain_sum(inputs, result.survivors, session.modulus_bits)
        np.testing.assert_array_equal(
            result.total.astype(np.uint64), expected, err_msg=run.replay_hint(fed)
        )
    record_property(f"fuzz_{run.family}_rounds", rounds)
    run.report(messages=fed)


def _respond_fuzzed(
    config: dict[str, Any],
    arrays: dict[str, Any],
    cid: int,
    client: SecAggClient | None,
    keys: Keys,
    vector: np.ndarray | None,
) -> None:
    request = decode_message(config, arrays)
    copy = _client_copy(cid, request, client, keys)
    copy.respond(request, None if vector is None else vector.copy())


def test_a_session_view_with_a_degree_past_uint32_is_refused_at_decoding() -> None:
    """Found by the client fuzz: neighbors = 2^32 decoded, then the view's canonical
    encoding (uint32 fields) raised struct.error when the client compared sessions."""
    config, arrays = next(
        (c, a)
        for c, a in _valid_messages()
        if c["msg"] == "advertise_request" and "session.holder" in c
    )
    config["session.neighbors"] = 2**32
    with pytest.raises(SecAggProtocolError, match=r"session\.neighbors"):
        decode_message(config, arrays)
