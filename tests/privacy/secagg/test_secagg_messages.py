"""Wire codec: round trips, and garbage or mutated input raises only SecAggProtocolError."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secagg_helpers import identity_keys, make_session, random_inputs

from fedveil.privacy.secagg import (
    AdvertiseRequest,
    Message,
    SecAggProtocolError,
    SessionConfig,
    Stage,
    ThreatMode,
    decode_message,
    run_in_memory,
)
from fedveil.privacy.secagg.messages import ALL_MESSAGES


def _capture_one_of_each() -> dict[type[Message], Message]:
    session = make_session(5, dimension=6, bits=20, mode=ThreatMode.MALICIOUS)
    seen: dict[type[Message], Message] = {}

    def down(stage: Stage, cid: int, message: Message) -> Message:
        seen.setdefault(type(message), message)
        return message

    def up(stage: Stage, cid: int, message: Message) -> list[Message]:
        seen.setdefault(type(message), message)
        return [message]

    run_in_memory(
        session,
        random_inputs(session, 0),
        identity_keys=identity_keys(session),
        tamper_down=down,
        tamper_up=up,
    )
    return seen


SAMPLES = _capture_one_of_each()
WIRE = {cls: SAMPLES[cls].to_wire() for cls in ALL_MESSAGES}


def test_every_message_kind_was_captured_and_round_trips() -> None:
    assert set(SAMPLES) == set(ALL_MESSAGES)
    for cls, message in SAMPLES.items():
        config, arrays = message.to_wire()
        for value in config.values():
            assert isinstance(value, (int, float, str, bytes, bool, list))
        assert all(isinstance(a, np.ndarray) for a in arrays.values())
        again = cls.from_wire(config, arrays)
        assert type(decode_message(config, arrays)) is cls
        assert again.to_wire()[0] == config
        assert again.client_id == message.client_id and again.session_id == message.session_id


def test_session_config_round_trips() -> None:
    session = SAMPLES[AdvertiseRequest].session  # type: ignore[attr-defined]
    assert SessionConfig.from_wire(*session.to_wire()) == session
    assert SessionConfig.from_bytes(session.to_bytes()) == session
    with pytest.raises(SecAggProtocolError):
        SessionConfig.from_bytes(session.to_bytes()[:-3])


def test_share_coordinates_looked_up_together_match_one_by_one() -> None:
    session = make_session(40, dimension=4, bits=20)
    holders = list(session.client_ids[::3])[::-1]
    assert session.share_xs(holders) == [session.share_x(h) for h in holders]
    stranger = max(session.client_ids) + 1
    for bad in ([*holders, stranger], [stranger]):
        with pytest.raises(KeyError, match=f"client {stranger} is not in the cohort"):
            session.share_xs(bad)


@pytest.mark.parametrize(
    ("protocol", "named"),
    [(None, "missing"), ("fedveil-secagg/1", "'fedveil-secagg/1'"), (2, "'2'")],
)
def test_a_session_of_another_protocol_revision_is_refused_by_name(protocol, named) -> None:
    config, arrays = WIRE[AdvertiseRequest]
    config = dict(config)
    if protocol is None:
        del config["session.protocol"]  # what a server of revision 1 sent
    else:
        config["session.protocol"] = protocol
    with pytest.raises(SecAggProtocolError) as raised:
        AdvertiseRequest.from_wire(config, arrays)
    message = str(raised.value)
    assert "advertise_request.session.protocol" in message and named in message
    assert "fedveil-secagg/3" in message


scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.binary(max_size=120),
    st.booleans(),
    st.none(),
)
wire_values = st.one_of(
    scalars,
    st.lists(st.integers(-(2**65), 2**65), max_size=6),
    st.lists(st.binary(max_size=100), max_size=6),
    st.lists(scalars, max_size=4),
    st.dictionaries(st.text(max_size=5), scalars, max_size=3),
)
arrays_values = st.one_of(
    wire_values,
    st.sampled_from(["uint32", "uint64", "int64", "float32", "uint8", ">u4", "object"]).flatmap(
        lambda dt: st.integers(0, 8).map(
            lambda n: np.zeros(n, dtype=dt) if dt != "object" else np.array([None] * n)
        )
    ),
    st.just(np.zeros((2, 3), dtype=np.uint32)),
    st.just(np.uint32(5)),
)


def _decode(cls: type[Message], config: Any, arrays: Any) -> None:
    for decoder in (cls.from_wire, decode_message):
        try:
            message = decoder(config, arrays)
        except SecAggProtocolError:
            continue
        message.to_wire()  # anything accepted must be a well-formed message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cls=st.sampled_from(ALL_MESSAGES),
    config=st.one_of(st.dictionaries(st.text(max_size=25), wire_values, max_size=8), wire_values),
    arrays=st.one_of(st.dictionaries(st.text(max_size=25), arrays_values, max_size=3), scalars),
)
def test_garbage_raises_only_protocol_errors(cls: type[Message], config: Any, arrays: Any) -> None:
    _decode(cls, config, arrays)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cls=st.sampled_from(ALL_MESSAGES), data=st.data())
def test_mutated_valid_messages_raise_only_protocol_errors(
    cls: type[Message], data: st.DataObject
) -> None:
    config, arrays = (dict(part) for part in WIRE[cls])
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from(["config", "arrays"]))
        record: dict[str, Any] = config if target == "config" or not arrays else arrays
        action = data.draw(st.sampled_from(["replace", "delete", "add", "truncate", "extend"]))
        key = data.draw(st.sampled_from(sorted(record))) if record else "msg"
        if action == "replace":
            record[key] = data.draw(arrays_values if record is arrays else wire_values)
        elif action == "delete":
            record.pop(key, None)
        elif action == "add":
            record[data.draw(st.text(max_size=10))] = data.draw(wire_values)
        elif action == "truncate" and isinstance(record.get(key), (bytes, list, np.ndarray)):
            record[key] = record[key][: data.draw(st.integers(0, max(0, len(record[key]) - 1)))]
        elif action == "extend" and isinstance(record.get(key), (bytes, list)):
            record[key] = record[key] + record[key][:1]
    _decode(cls, config, arrays)


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.KIND)
def test_wrong_message_tag_and_stage_are_named(cls: type[Message]) -> None:
    config, arrays = WIRE[cls]
    with pytest.raises(SecAggProtocolError, match=rf"{cls.KIND}\.msg"):
        cls.from_wire({**config, "msg": "something_else"}, arrays)
    with pytest.raises(SecAggProtocolError, match=rf"{cls.KIND}\.stage"):
        cls.from_wire({**config, "stage": "other"}, arrays)
    with pytest.raises(SecAggProtocolError, match=rf"{cls.KIND}\.client_id"):
        cls.from_wire({**config, "client_id": True}, arrays)
    with pytest.raises(SecAggProtocolError, match="session_id"):
        cls.from_wire({**config, "session_id": b"short"}, arrays)
