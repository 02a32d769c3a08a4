"""Heartbeats written in batches: a SendNodeHeartbeat answered without SQLite on its path.

Contract. In flwr 1.42 each SendNodeHeartbeat is one `UPDATE node` in its own
transaction (`SqlLinkState.acknowledge_node_heartbeat`), so one request in eight of an
idle fleet takes SQLite's single write lock, and the other requests' connections and
threads queue behind it. `Heartbeats.answer` answers such a request in the Fleet
listener (fleet_listener.LocalFleet, next to idle_polls.IdlePolls) when, and only when:

- the request is a well-formed protobuf SendNodeHeartbeat with Flower's media type and
  an interval Flower accepts (`HEARTBEAT_MIN_INTERVAL <= interval <= ...MAX`, so a NaN
  fails it). Anything else goes down Flower's path, which refuses it as before;
- Flower's own `authenticate_node` passes on it (called, not copied: the signature over
  a timestamp in Flower's window, the key registered and not deleted, the node id the
  key's). A refusal is left to Flower's path, which answers it with its own 401.

The answer is Flower's `SendNodeHeartbeatResponse(success=True)`: Flower answers `True`
when its UPDATE found the node registered and not deleted, which is what
`authenticate_node` has just checked. The heartbeat's effect is noted in memory
(`HeartbeatBatch.note`) as Flower computes it at arrival: `online_until = now +
HEARTBEAT_PATIENCE * interval`, the interval, and `last_activated_at = now` should the
node not be online. A background thread writes the noted nodes every `FLUSH_INTERVAL_S`
in one transaction, with Flower's own statement shape (the same columns, the same
`status != unregistered` guard, so a deleted node is never revived).

Liveness stays exact. Every statement of the process passes `before_cursor_execute` (a
declared SQLAlchemy event, as for idle_polls), and every statement on the `node` table
(Flower's offline tagging, node listing and `get_nodes` for the ServerApp's node ids,
the reply-availability check of dropout detection, the destination check of a push,
activation, deactivation, deletion) first commits the pending heartbeats, on its own
connection, before it runs. So a read sees every heartbeat answered before it, and a
write to a node is ordered after them, as in Flower. Two statements skip this: one
inside a transaction that has already written (its connection holds the write lock the
flush would wait for; its transaction's first node statement flushed), and
`authenticate_node`'s lookup of a node id by key, whose answer only a deletion changes,
never a heartbeat.

A node that stops heartbeating goes offline on time: its `online_until` is the one its
last heartbeat set at arrival, not at the write, and Flower's offline tagging reads it
after a flush. A crash of the SuperLink loses at most the heartbeats of the last
interval (<= FLUSH_INTERVAL_S), which delays nothing: with HEARTBEAT_PATIENCE = 2 the
previous heartbeat's `online_until` lies a full interval (>= 10 s) past the one lost,
and the node's next heartbeat (Flower's SuperNode sends one every 0.7-0.9 interval, and
retries on connection errors) comes before it. A lost write can only make a node look
offline early, never keep a silent node online.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fedveil.server.coordinator.idle_polls import authenticated, protobuf_body
from fedveil.server.coordinator.upstream_pool import UpstreamResponse

log = logging.getLogger("fedveil.fleet")

HEARTBEAT_PATH = "/v1/fleet/send-node-heartbeat"
# How long a heartbeat may wait in memory. Far below Flower's smallest patience
# (HEARTBEAT_PATIENCE * HEARTBEAT_MIN_INTERVAL = 20 s); reads flush first anyway.
FLUSH_INTERVAL_S = 0.5
# A statement on the node table, and whether it writes.
_NODE_TABLE = re.compile(r"\b(FROM|UPDATE|INTO|JOIN)\s+node\b", re.IGNORECASE)
# Flower's get_node_id_by_public_key: only a deletion changes its answer, never a heartbeat.
_KEY_LOOKUP = re.compile(
    r"\s*SELECT\b[^;]*\bFROM node\b[^;]*\bWHERE node\.public_key = \?", re.IGNORECASE
)
# flwr 1.42's acknowledge_node_heartbeat, column for column, with the values of the
# heartbeat's arrival; a deleted (unregistered) node is left as it is.
_FLUSH_SQL = (
    "UPDATE node SET online_until = :online_until, heartbeat_interval = :interval, "
    "last_activated_at = CASE WHEN status != :online THEN :arrived_at "
    "ELSE last_activated_at END, status = :online "
    "WHERE node_id = :node_id AND status != :unregistered"
)


@dataclass(frozen=True)
class Beat:
    """One node's latest heartbeat, as Flower's acknowledge_node_heartbeat computes it."""

    online_until: float
    interval: float
    arrived_at: str  # ISO time: last_activated_at, should the node not be online


class HeartbeatBatch:
    """The heartbeats answered but not yet written, per node (uint64 id, as on the
    wire); written in one transaction by `flush`, every `interval_s` by the flusher
    thread and before any statement that reads or writes a node's liveness."""

    def __init__(self, state: Any, interval_s: float = FLUSH_INTERVAL_S) -> None:
        if not (0 < interval_s < math.inf):
            raise ValueError(f"heartbeat flush interval_s is {interval_s!r}: must be > 0, finite")
        self._state = state  # Flower's SqlLinkState: its session() is the connection pool
        self._interval_s = interval_s
        self._lock = threading.Lock()  # guards _pending
        self._flush_lock = threading.Lock()  # one flush at a time: snapshot to commit
        self._pending: dict[int, Beat] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.flushes = 0  # transactions committed with at least one heartbeat

    def note(self, node_id: int, interval: float, now: float) -> None:
        beat = Beat(
            online_until=now + _patience() * interval,
            interval=interval,
            arrived_at=datetime.fromtimestamp(now, tz=UTC).isoformat(),
        )
        with self._lock:
            self._pending[node_id] = beat  # the latest heartbeat wins, as in Flower

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self, connection: Any = None) -> int:
        """Write every pending heartbeat in one transaction; the count written.

        `connection`: a DBAPI sqlite3 connection in no transaction, used for the write
        (a reader's own, from `before_statement`); None: one from Flower's pool, checked
        out before the flush lock is taken, so that no thread holds the lock while it
        waits for a pooled connection that a thread waiting for the lock holds."""
        if connection is None:
            # An empty context: Flower's session() then opens a connection of its own.
            return contextvars.Context().run(self._flush_pooled)
        return self._flush_on(connection)

    def _flush_pooled(self) -> int:
        with self._state.session() as session:
            dbapi = session.connection().connection.dbapi_connection
            return self._flush_on(dbapi)

    def _flush_on(self, dbapi: Any) -> int:
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, {}
            if not batch:
                return 0
            try:
                # On the DBAPI connection: no SQLAlchemy event sees this write, so
                # neither this module's listener nor node_keys.py's reacts to it.
                dbapi.executemany(_FLUSH_SQL, _rows(batch))
                dbapi.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    dbapi.rollback()
                with self._lock:  # not lost: back in, unless a newer heartbeat came
                    for node, beat in batch.items():
                        self._pending.setdefault(node, beat)
                raise
            self.flushes += 1
            return len(batch)

    def before_statement(self, cursor: Any, statement: str) -> None:
        """Flush first if `statement` reads or writes a node's liveness (module docstring)."""
        if not _NODE_TABLE.search(statement) or _KEY_LOOKUP.match(statement):
            return  # authenticate_node's lookup: a heartbeat never changes its answer
        dbapi = getattr(cursor, "connection", None)
        if dbapi is None or getattr(dbapi, "in_transaction", True):
            return  # this transaction holds the write lock: its first node statement flushed
        with self._lock:
            if not self._pending:
                return
        # On the reader's own connection, in a transaction of its own committed before
        # the reader's statement runs: no second pooled connection is needed.
        self.flush(dbapi)

    def start(self) -> None:
        """Listen to the process's statements and start the flusher thread."""
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        def before(
            _conn: Any, cursor: Any, statement: str, _params: Any, _ctx: Any, _many: bool
        ) -> None:
            self.before_statement(cursor, statement)

        event.listen(Engine, "before_cursor_execute", before)
        self._thread = threading.Thread(
            target=self._run, name="fedveil-heartbeat-flush", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.flush()
            except Exception as exc:  # kept pending: the next tick or read writes them
                log.warning("heartbeat flush failed (%s: %s); retrying", type(exc).__name__, exc)

    def close(self) -> None:
        """Stop the flusher and write what is pending (at the SuperLink's shutdown)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.flush()


def _rows(batch: dict[int, Beat]) -> list[dict[str, Any]]:
    from flwr.supercore.constant import NodeStatus
    from flwr.supercore.utils import uint64_to_int64

    return [
        {
            "node_id": uint64_to_int64(node),  # stored as Flower stores it: signed int64
            "online_until": beat.online_until,
            "interval": beat.interval,
            "arrived_at": beat.arrived_at,
            "online": NodeStatus.ONLINE,
            "unregistered": NodeStatus.UNREGISTERED,
        }
        for node, beat in batch.items()
    ]


def _patience() -> float:
    from flwr.common.constant import HEARTBEAT_PATIENCE

    return float(HEARTBEAT_PATIENCE)


def batched_heartbeats(
    superlink_app: Any, interval_s: float = FLUSH_INTERVAL_S
) -> HeartbeatBatch | None:
    """A started batch for `superlink_app`'s LinkState; None (heartbeats go down Flower's
    path) where that state is not SQL. Call it before the app serves a request."""
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    factory = getattr(superlink_app.state, "linkstate_factory", None)
    state = None if factory is None else factory.state()
    if not isinstance(state, SqlLinkState):
        return None
    batch = HeartbeatBatch(state, interval_s)
    batch.start()
    return batch


class Heartbeats:
    """Answers an authenticated SendNodeHeartbeat from memory (see the module
    docstring); None: not answered here, the caller passes it to Flower's Fleet routes."""

    def __init__(self, auth_app: Any, batch: HeartbeatBatch) -> None:
        from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatResponse
        from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE

        self._app = auth_app  # request.app for authenticate_node (node_keys.AuthApp)
        self._batch = batch
        self._ok = SendNodeHeartbeatResponse(success=True).SerializeToString()
        self._headers = [(b"content-type", PROTOBUF_MEDIA_TYPE.encode())]

    async def answer(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse | None:
        if path != HEARTBEAT_PATH:
            return None
        from flwr.common.constant import HEARTBEAT_MAX_INTERVAL, HEARTBEAT_MIN_INTERVAL
        from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest

        beat = protobuf_body(SendNodeHeartbeatRequest, body, headers)
        if beat is None:
            return None
        interval = float(beat.heartbeat_interval)
        # Written so that a NaN fails it: Flower's path then refuses it with its error.
        if not (HEARTBEAT_MIN_INTERVAL <= interval <= HEARTBEAT_MAX_INTERVAL):
            return None
        if not await authenticated(self._app, path, headers, beat):
            return None
        self._batch.note(int(beat.node.node_id), interval, time.time())
        return UpstreamResponse(200, list(self._headers), self._ok)
