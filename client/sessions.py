"""The one owner of a client's secure-aggregation sessions and of how long they live.

Secure aggregation is pipelined (fedveil.protocol.piggyback): the key stages of
round r+1 ride on round r's exchanges, so a client may hold two sessions at
once, its session for round r (still to unmask) and the one for round r+1.
A session therefore lives into the next round and no further: PIPELINE_DEPTH.

`SecAggSessions` keeps one client's sessions in its flat state store (a dict of
plain values, which a Flower node can persist between messages) under
`sa.state.<round>.`; `RoundClock` is how a holder of client state (the
in-process lane and workers, a device) tells a new round, or a new run, from
the messages it gets; `outlives` is the retention rule both apply.

Asynchronous training numbers its messages by dispatch, not round, and a group's keys
agreed ahead are used after later dispatches: there the in-process holders retire
nothing by round (ClientStates(retire_by_round=False), the worker pool), and a client's
session ends when it unmasks or opens its next.
"""

from __future__ import annotations

import enum
from typing import Any

from fedveil.protocol.fields import SA

# Rounds a session outlives its own: the next round's key stages ride on this round's.
PIPELINE_DEPTH = 1
STATE = SA + "state."  # + "<round>." + the SecAggClient's state keys


def outlives(state_round: int, current_round: int) -> bool:
    """Whether state for `state_round` is still needed once `current_round` has begun."""
    return state_round >= current_round - PIPELINE_DEPTH


class Advance(enum.Enum):
    """What a message's round means to a holder of client state."""

    SAME = "same"  # a round already begun (or an earlier one the pipeline still reaches)
    NEW_ROUND = "new round"  # drop what no longer outlives it
    NEW_RUN = "new run"  # further back than the pipeline reaches: the server started over


class RoundClock:
    """The latest round a holder of client state has seen."""

    def __init__(self) -> None:
        self.round: int | None = None

    def advance(self, round_num: int) -> Advance:
        if self.round is not None and not outlives(round_num, self.round):
            self.round = round_num
            return Advance.NEW_RUN
        if self.round is not None and round_num <= self.round:
            return Advance.SAME
        self.round = round_num
        return Advance.NEW_ROUND


def _slot(round_num: int) -> str:
    return f"{STATE}{round_num}."


def _slot_round(key: str) -> int:
    head = key[len(STATE) :].split(".", 1)[0]
    return int(head) if head.lstrip("-").isdigit() else -1


class SecAggSessions:
    """One client's secure-aggregation sessions, by round, in its state store `store`
    (modified in place: the store is what the transport keeps between messages)."""

    def __init__(self, store: dict[str, Any]) -> None:
        self.store = store

    def rounds(self) -> list[int]:
        """The rounds with a session held, in order."""
        return sorted({_slot_round(k) for k in self.store if k.startswith(STATE)})

    def open(self, round_num: int) -> None:
        """Make room for round `round_num`'s new session: only the previous round's (which
        may still unmask) survives; any other secure-aggregation state goes."""
        previous = _slot(round_num - 1)
        for key in [k for k in self.store if k.startswith(SA) and not k.startswith(previous)]:
            del self.store[key]

    def restore(self, round_num: int) -> dict[str, Any]:
        """The saved protocol state of round `round_num`'s session; empty when none is held."""
        slot = _slot(round_num)
        return {k[len(slot) :]: v for k, v in self.store.items() if k.startswith(slot)}

    def save(self, round_num: int, state: dict[str, Any]) -> None:
        """Keep `state` (a SecAggClient's to_state()) as round `round_num`'s session."""
        self.end(round_num)
        slot = _slot(round_num)
        for key, value in state.items():
            self.store[slot + key] = value

    def end(self, round_num: int) -> None:
        """Drop round `round_num`'s session (after its unmask stage nothing is kept)."""
        slot = _slot(round_num)
        for key in [k for k in self.store if k.startswith(slot)]:
            del self.store[key]

    def retire(self, current_round: int) -> None:
        """Drop sessions that do not outlive the start of `current_round`."""
        for key in [
            k
            for k in self.store
            if k.startswith(STATE) and not outlives(_slot_round(k), current_round)
        ]:
            del self.store[key]


class ClientStates:
    """Many clients' state stores in one process (the in-process lane): a client's store
    lives as long as the latest round it was contacted for outlives the current round.

    `retire_by_round=False` (asynchronous training, whose rounds are dispatch numbers):
    nothing is retired by the round clock, since a group's keys agreed ahead are used
    after any number of later dispatches; a client's session then ends when it unmasks
    or opens its next one (SecAggSessions.open), so at most one stale session per client
    is kept (a group that aborted)."""

    def __init__(self, *, retire_by_round: bool = True) -> None:
        self.stores: dict[int, dict[str, Any]] = {}
        self._latest: dict[int, int] = {}  # client -> latest round its state is for
        self._clock = RoundClock()
        self.retire_by_round = retire_by_round

    def store_for(self, client_id: int, round_num: int, latest: int) -> dict[str, Any]:
        """The store of `client_id` for a message of round `round_num` that carries work
        up to round `latest` (a rider's round)."""
        self.advance(round_num)
        self._latest[client_id] = max(self._latest.get(client_id, round_num), latest)
        return self.stores.setdefault(client_id, {})

    def release_if_empty(self, client_id: int) -> None:
        """Forget a client that keeps nothing (plain training leaves no state)."""
        if not self.stores.get(client_id):
            self.stores.pop(client_id, None)
            self._latest.pop(client_id, None)

    def advance(self, round_num: int) -> None:
        """On a new round, drop the stores of clients last contacted for a round that does
        not outlive it, and the older sessions of the others; on a new run, everything."""
        if not self.retire_by_round:
            return
        step = self._clock.advance(round_num)
        if step is Advance.SAME:
            return
        if step is Advance.NEW_RUN:
            self.stores.clear()
            self._latest.clear()
        for cid in [c for c, r in self._latest.items() if not outlives(r, round_num)]:
            del self._latest[cid]
            self.stores.pop(cid, None)
        for store in self.stores.values():
            SecAggSessions(store).retire(round_num)
