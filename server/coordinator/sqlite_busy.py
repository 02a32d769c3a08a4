"""How long the SuperLink's SQLite connections wait for the write lock before failing.

Contract. `wait_for_sqlite_writes()`, called in the SuperLink child before Flower opens
its state (link_socket.superlink_main), makes every SQLite connection of that process
wait up to `BUSY_TIMEOUT_S` for the database's write lock, where Flower (flwr 1.42,
`SQLITE_PRAGMAS`) waits 5 s and then fails the statement with "database is locked",
which its Fleet routes answer with a 500.

Why. SQLite lets one writer at a time, and in flwr 1.42 nearly every Fleet request
writes: PullObject and PushObject call `check_abort`, whose `get_tasks` runs an UPDATE
expiring task tokens (it takes the write lock even when no row changes), then
`store_traffic` updates the run's byte counters. During a secure round of 100-200
devices the requests of the whole fleet queue for that one lock, and each holder needs
the GIL, shared with Flower's 40 worker threads, to reach its commit: on a loaded
machine a request waited past 5 s and got a 500. A SuperNode does not retry a 500
(flwr.supercore.retry.http_retry retries 502, 503, 504 and transport errors only): the
message it was pulling or pushing is dropped, and the device misses the stage.

A longer wait turns that failure into latency; the coordinator's exchanges have
deadlines of minutes. It stays below the 30 s after which a SuperNode's request times
out (and is retried: a read timeout is retryable): PullObject and PushObject are
idempotent, but PullMessages claims the messages it returns, and one that completed
after its client had given up would deliver them to nobody. A request that waits once
for the lock still answers its client in time.

The pragma is set when a connection is first checked out of its pool (SQLAlchemy's
declared `checkout` pool event), after Flower's own `connect` listener has set its 5 s,
and once per connection (marked in the connection record's `info`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

BUSY_TIMEOUT_S = 20.0  # Flower's: 5 s; a SuperNode's request timeout: 30 s
_MARK = "fedveil_busy_timeout"


def set_busy_timeout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    """Pool `checkout` listener: the longer wait, once per SQLite connection."""
    if record.info.get(_MARK) or not isinstance(dbapi_conn, sqlite3.Connection):
        return
    dbapi_conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    record.info[_MARK] = True


def wait_for_sqlite_writes() -> None:
    """Every pool of this process: SQLite connections wait BUSY_TIMEOUT_S for the lock."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    if not event.contains(Pool, "checkout", set_busy_timeout):
        event.listen(Pool, "checkout", set_busy_timeout)
