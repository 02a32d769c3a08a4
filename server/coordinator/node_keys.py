"""The node id registered for a public key, from memory, for the Fleet requests
answered in the listener (idle polls, heartbeats).

Contract. Flower's `authenticate_node` checks, on every Fleet request, the signature over
a timestamp inside its window and then that the node id in the request is the one
registered for the signing key: `LinkState.get_node_id_by_public_key`, an indexed
SELECT in its own SQLAlchemy session (about 0.2 ms of CPU, and under load a wait for
one of the pool's connections). `NodeKeys` answers that lookup from a map filled from
Flower's own method on a miss; the signature and the time window are still checked by
Flower's function on every request (`auth_app`: Flower's `authenticate_node` is called
with it, and reads the state through it).

Why the map cannot authenticate a deleted node. Only positive answers are kept (an
unknown key always reaches SQLite). A node's key is written once, at registration, and
a node stops authenticating only by a write to the `node` table (Flower's
`delete_node` sets it unregistered). Every write to `node` of this process passes
`before_cursor_execute` (a declared SQLAlchemy event, as for idle_polls.py) and empties
the map before it runs, and again when its connection goes back to the pool (the
`checkin` pool event, after its commit or rollback), each time moving a generation
counter on. A miss fills the map only if the generation did not move during its read,
so a read that began before the write committed never brings the old answer back. The
one write not seen is fedveil's own heartbeat flush (heartbeats.py, on the DBAPI
connection, below SQLAlchemy's events): it only sets a non-deleted node online, and
never touches a key or a deleted node.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

_NODE_WRITE = re.compile(r"\s*(UPDATE|INSERT INTO|DELETE FROM)\s+node\b", re.IGNORECASE)
_MARK = "fedveil_node_write"


class NodeKeys:
    """public key -> node id (uint64) for registered, not deleted nodes (see the module
    docstring); the one LinkState method `authenticate_node` calls."""

    def __init__(self, state: Any) -> None:
        self._state = state  # Flower's SqlLinkState: the source of every answer
        self._lock = threading.Lock()
        self._ids: dict[bytes, int] = {}
        self._generation = 0
        self.hits = 0
        self._listeners: list[tuple[Any, str, Callable[..., None]]] = []

    def get_node_id_by_public_key(self, public_key: bytes) -> int | None:
        with self._lock:
            node = self._ids.get(public_key)
            generation = self._generation
            if node is not None:
                self.hits += 1
                return node
        node = self._state.get_node_id_by_public_key(public_key)
        if node is not None:
            with self._lock:
                if self._generation == generation:  # no write to `node` since the read began
                    self._ids[public_key] = node
        return node

    def forget(self) -> None:
        with self._lock:
            self._ids.clear()
            self._generation += 1

    def before_statement(self, connection_info: dict[Any, Any], statement: str) -> None:
        if _NODE_WRITE.match(statement):
            connection_info[_MARK] = True
            self.forget()

    def after_checkin(self, connection_info: dict[Any, Any]) -> None:
        if connection_info.pop(_MARK, False):
            self.forget()

    def watch(self) -> None:
        """Listen to every statement and connection check-in of this process."""
        from sqlalchemy import event
        from sqlalchemy.engine import Engine
        from sqlalchemy.pool import Pool

        def before(
            conn: Any, _cursor: Any, statement: str, _params: Any, _ctx: Any, _many: bool
        ) -> None:
            self.before_statement(conn.connection.info, statement)

        def checkin(_dbapi_conn: Any, record: Any) -> None:
            self.after_checkin(record.info)

        self._listeners = [(Engine, "before_cursor_execute", before), (Pool, "checkin", checkin)]
        for target, name, fn in self._listeners:
            event.listen(target, name, fn)

    def unwatch(self) -> None:
        """Stop listening (the map is then emptied: it can no longer be kept right)."""
        from sqlalchemy import event

        for target, name, fn in self._listeners:
            event.remove(target, name, fn)
        self._listeners = []
        self.forget()


class _KeyLookupFactory:
    """What Flower's `get_linkstate` calls on `request.app.state.linkstate_factory`."""

    def __init__(self, keys: NodeKeys) -> None:
        self._keys = keys

    def state(self) -> NodeKeys:
        return self._keys


class _AppState:
    def __init__(self, keys: NodeKeys) -> None:
        self.linkstate_factory = _KeyLookupFactory(keys)


class AuthApp:
    """The `request.app` given to Flower's `authenticate_node` on the memory paths: its
    state's LinkState is `keys`. Should Flower's function call any other method, the
    AttributeError counts as a refusal there, and the request goes down Flower's path."""

    def __init__(self, keys: NodeKeys) -> None:
        self.state = _AppState(keys)


def watched_keys(superlink_app: Any) -> NodeKeys | None:
    """The key map for `superlink_app`'s LinkState, listening from now on; None where
    that state is not SQL. Call it before the app serves a request."""
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    factory = getattr(superlink_app.state, "linkstate_factory", None)
    state = None if factory is None else factory.state()
    if not isinstance(state, SqlLinkState):
        return None
    keys = NodeKeys(state)
    keys.watch()
    return keys
