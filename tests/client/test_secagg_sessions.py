"""The client's one owner of secure-aggregation sessions and their retention."""

from __future__ import annotations

import pytest

from fedveil.client.sessions import (
    PIPELINE_DEPTH,
    Advance,
    ClientStates,
    RoundClock,
    SecAggSessions,
    outlives,
    pack_session,
)
from fedveil.privacy.secagg import SecAggClient, SessionConfig
from fedveil.privacy.secagg.view import SessionView
from fedveil.protocol.envelope import MessageError


def test_a_session_lives_into_the_next_round_and_no_further() -> None:
    assert PIPELINE_DEPTH == 1
    assert outlives(5, 5) and outlives(5, 6) and outlives(7, 6)
    assert not outlives(5, 7)


def test_open_keeps_only_the_previous_rounds_session() -> None:
    store: dict[str, object] = {}
    sessions = SecAggSessions(store)
    for r in (3, 4, 5):
        sessions.save(r, {"stage": f"s{r}", "key": bytes([r])})
    store["sa.other"] = 1  # any other secure-aggregation state goes too
    store["ledger"] = "kept"  # state of no session is not the owner's
    sessions.open(6)
    assert sessions.rounds() == [5]
    assert sessions.restore(5) == {"stage": "s5", "key": b"\x05"}
    assert store["ledger"] == "kept" and "sa.other" not in store


def test_restore_save_end_and_retire() -> None:
    sessions = SecAggSessions({})
    assert sessions.restore(2) == {}
    sessions.save(2, {"a": 1, "b": 2})
    sessions.save(2, {"a": 3})  # a save replaces the round's session whole
    assert sessions.restore(2) == {"a": 3}
    sessions.save(3, {"a": 4})
    sessions.retire(3)  # round 2 may still unmask while round 3 runs
    assert sessions.rounds() == [2, 3]
    sessions.retire(4)
    assert sessions.rounds() == [3]
    sessions.end(3)  # after unmask nothing is kept
    assert sessions.rounds() == [] and sessions.store == {}


def test_round_clock_tells_new_rounds_and_new_runs() -> None:
    clock = RoundClock()
    assert clock.advance(4) is Advance.NEW_ROUND
    assert clock.advance(4) is Advance.SAME
    assert clock.advance(3) is Advance.SAME  # the previous round's unmask, pipelined
    assert clock.advance(5) is Advance.NEW_ROUND
    assert clock.advance(3) is Advance.NEW_RUN  # further back than the pipeline reaches
    assert clock.round == 3


def test_client_states_drop_clients_and_sessions_the_pipeline_no_longer_reaches() -> None:
    states = ClientStates()
    a = states.store_for(1, 1, 2)  # round 1 carrying round 2's key stages
    SecAggSessions(a).save(1, {"x": 1})
    SecAggSessions(a).save(2, {"x": 2})
    b = states.store_for(2, 1, 1)
    SecAggSessions(b).save(1, {"x": 1})
    states.store_for(3, 1, 1)
    states.release_if_empty(3)  # kept nothing: forgotten
    assert sorted(states.stores) == [1, 2]
    states.advance(3)  # client 2 was last needed for round 1; client 1's round 1 is over
    assert list(states.stores) == [1]
    assert SecAggSessions(states.stores[1]).rounds() == [2]
    states.advance(1)  # a new run
    assert states.stores == {}


def test_a_session_is_one_packed_entry_of_the_store() -> None:
    # Flower pickles a node's state with every message and type-checks each entry it
    # writes: a session is one bytes value, whatever its fields.
    store: dict[str, object] = {"ledger": "kept"}
    state = {
        "version": 1,
        "client_id": 7,
        "stage": "shared",
        "seed": bytes(range(32)),
        "n": -5,
        "run_id": 2**64 - 1,  # Flower's run ids are unsigned 64-bit
        "zero": 0,
        "low": -(2**63),
    }
    SecAggSessions(store).save(4, state)
    assert sorted(store) == ["ledger", "sa.state.4"] and isinstance(store["sa.state.4"], bytes)
    assert SecAggSessions(store).restore(4) == state


def test_a_real_client_resumes_from_its_packed_state() -> None:
    session = SessionConfig.create(
        range(10), dimension=4, modulus_bits=16, run_id=b"r", round=3, neighbors=9, threshold=5
    )
    client = SecAggClient(2, SessionView.of(session, 2, session.neighbours_of(2)))
    client.advertise()
    sessions = SecAggSessions({})
    sessions.save(3, client.to_state())
    assert SecAggClient.from_state(sessions.restore(3)).to_state() == client.to_state()


GOOD = pack_session({"stage": "advertised", "seed": b"s" * 32, "version": 1})


@pytest.mark.parametrize(
    ("stored", "named"),
    [
        (GOOD[:-1], "truncated"),  # a value cut short
        (GOOD[:7], "truncated|unpack"),  # cut inside an entry's header
        (b"fvss9" + GOOD[5:], "magic"),
        ("a string", "magic"),
        ({"stage": "advertised"}, "magic"),  # the flat layout of before: not guessed at
        (GOOD + GOOD[5:], "repeated"),
        (GOOD.replace(b"seed\x01", b"seed\x07"), "type tag 7"),
        (
            GOOD.replace(
                b"version\x00\x00\x00\x00\x01\x01", b"version\x00\x00\x00\x00\x02\x00\x01"
            ),
            "int of 2 bytes, not canonical",
        ),
    ],
)
def test_a_malformed_saved_session_is_refused_by_name(stored: object, named: str) -> None:
    with pytest.raises(MessageError, match=f"saved session unreadable: .*({named})"):
        SecAggSessions({"sa.state.4": stored}).restore(4)
