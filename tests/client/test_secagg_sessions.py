"""The client's one owner of secure-aggregation sessions and their retention."""

from __future__ import annotations

from fedveil.client.sessions import (
    PIPELINE_DEPTH,
    Advance,
    ClientStates,
    RoundClock,
    SecAggSessions,
    outlives,
)


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
