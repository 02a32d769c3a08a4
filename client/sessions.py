"""The one owner of a client's secure-aggregation sessions and of how long they live.

Secure aggregation is pipelined (fedveil.protocol.piggyback): the key stages of
round r+1 ride on round r's exchanges, so a client may hold two sessions at
once, its session for round r (still to unmask) and the one for round r+1.
A session therefore lives into the next round and no further: PIPELINE_DEPTH.

`SecAggSessions` keeps one client's sessions in its flat state store (a dict of
plain values, which a Flower node can persist between messages), each session as one
bytes value under `sa.state.<round>` (`pack_session` / `unpack_session`: Flower's
simulation pickles the node's state with every message both ways and type-checks
each entry whenever it is written, so a session is one entry, not one per field);
`RoundClock` is how a holder of client state (the
in-process lane and workers, a device) tells a new round, or a new run, from
the messages it gets; `outlives` is the retention rule both apply.

Asynchronous training numbers its messages by dispatch, not round, and a group's keys
agreed ahead are used after later dispatches: there the in-process holders retire
nothing by round (ClientStates(retire_by_round=False), the worker pool), and a client's
session ends when it unmasks or opens its next.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from typing import Any

from fedveil.protocol.envelope import MessageError
from fedveil.protocol.fields import SA

# Rounds a session outlives its own: the next round's key stages ride on this round's.
PIPELINE_DEPTH = 1
STATE = SA + "state."  # + "<round>": one session's packed SecAggClient state

# A packed session: magic, then per entry: name length (u8), name (ASCII), type tag (u8),
# value length (u32), value (int: signed 64-bit big-endian; bytes; str: UTF-8).
_PACK_MAGIC = b"fvss1"
_INT, _BYTES, _STR = 0, 1, 2
_ENTRY = struct.Struct(">B")
_VALUE = struct.Struct(">BI")
_INT_MAX_BYTES = 16  # Flower's run and node ids are unsigned 64-bit: 9 bytes signed


def _int_bytes(value: int) -> bytes:
    """The shortest big-endian two's complement of `value` (an unsigned 64-bit id too)."""
    return value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True)


def pack_session(state: Mapping[str, Any]) -> bytes:
    """One session's protocol state (a SecAggClient's `to_state()`: str keys, int, bytes or
    str values) as one bytes value."""
    parts = [_PACK_MAGIC]
    for name, value in state.items():
        key = name.encode("ascii")
        if type(value) is int:
            tag, raw = _INT, _int_bytes(value)
            if len(raw) > _INT_MAX_BYTES:
                raise ValueError(f"session state {name!r}: an int of {len(raw)} bytes")
        elif type(value) is bytes:
            tag, raw = _BYTES, value
        elif type(value) is str:
            tag, raw = _STR, value.encode("utf-8")
        else:
            raise TypeError(f"session state {name!r}: {type(value).__name__} is not int/bytes/str")
        parts += [_ENTRY.pack(len(key)), key, _VALUE.pack(tag, len(raw)), raw]
    return b"".join(parts)


def unpack_session(raw: Any) -> dict[str, Any]:
    """`pack_session`'s inverse; a MessageError naming the fault for anything else (a
    truncated or altered value, a repeated entry): a saved session is never guessed at."""
    try:
        if type(raw) is not bytes or not raw.startswith(_PACK_MAGIC):
            raise ValueError("not a packed session (magic missing)")
        state: dict[str, Any] = {}
        offset, end = len(_PACK_MAGIC), len(raw)
        while offset < end:
            (key_len,) = _ENTRY.unpack_from(raw, offset)
            offset += _ENTRY.size
            name = raw[offset : offset + key_len].decode("ascii")
            offset += key_len
            tag, size = _VALUE.unpack_from(raw, offset)
            offset += _VALUE.size
            value = raw[offset : offset + size]
            if len(name) != key_len or len(value) != size:
                raise ValueError("truncated")
            offset += size
            if name in state:
                raise ValueError(f"entry {name!r} repeated")
            if tag == _INT:
                number = int.from_bytes(value, "big", signed=True)
                if not (1 <= size <= _INT_MAX_BYTES) or _int_bytes(number) != value:
                    raise ValueError(f"entry {name!r}: an int of {size} bytes, not canonical")
                state[name] = number
            elif tag == _BYTES:
                state[name] = value
            elif tag == _STR:
                state[name] = value.decode("utf-8")
            else:
                raise ValueError(f"entry {name!r}: unknown type tag {tag}")
        return state
    except (ValueError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
        raise MessageError(f"secure aggregation: saved session unreadable: {exc}") from None


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
    return f"{STATE}{round_num}"


def _slot_round(key: str) -> int:
    head = key[len(STATE) :]
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
        for key in [k for k in self.store if k.startswith(SA) and k != previous]:
            del self.store[key]

    def restore(self, round_num: int) -> dict[str, Any]:
        """The saved protocol state of round `round_num`'s session; empty when none is held,
        a MessageError when what is held is not a packed session."""
        raw = self.store.get(_slot(round_num))
        return {} if raw is None else unpack_session(raw)

    def save(self, round_num: int, state: dict[str, Any]) -> None:
        """Keep `state` (a SecAggClient's to_state()) as round `round_num`'s session."""
        self.store[_slot(round_num)] = pack_session(state)

    def end(self, round_num: int) -> None:
        """Drop round `round_num`'s session (after its unmask stage nothing is kept)."""
        self.store.pop(_slot(round_num), None)

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
