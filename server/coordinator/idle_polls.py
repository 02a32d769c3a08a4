"""Idle polls answered from memory: a PullMessages for a node with nothing queued.

Contract. Nearly nine Fleet requests in ten of an idle fleet are PullMessages with
nothing to deliver. `IdlePolls.answer` answers such a pull with Flower's own empty
`PullMessagesResponse` without Flower's router (its protobuf middleware, dependencies,
thread-pool hops and the `get_message_ins` claim on SQLite), when, and only when:

- the request is a well-formed protobuf PullMessages (anything else: Flower's path);
- Flower's own `authenticate_node` passes on it (called, not copied: the same
  signature, time window, key and node-id checks, so unknown keys, a node id not the
  key's, revoked nodes and bad signatures behave as before; a refusal is left to
  Flower's path, which refuses it with its own answer);
- `PendingMessages` says the node is quiet.

Why the index cannot say "quiet" while a message waits. Flower delivers a message to a
node only if it is in `message_ins` for that node, undelivered, and
`created_at + ttl > now`. Every row of `message_ins` is written by this process (the
SuperLink owns its SQLite file; the Runtime and Control APIs are served here), and
every write goes through SQLAlchemy. `watch_message_writes` listens to every statement
any engine of the process executes, before it runs: an INSERT into `message_ins` marks
its destination busy until its `created_at + ttl`; a statement that could make a row
deliverable in any other way (anything but reads, deletes and Flower's claim, which
only sets `delivered_at`) marks every node busy for good (fail closed); so does a
row whose fields cannot be read. The rows already there when the process starts are
read once (`prime`) after the listener is in place, so none is missed; until then,
every node is busy. The index ignores deliveries, so it errs only towards "busy": a
delivered message keeps its node's polls on Flower's path until its TTL ends, which is
why fedveil gives its messages a TTL bounded by the round's deadline
(deploy_transport.message_ttl).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fedveil.server.coordinator.upstream_pool import UpstreamResponse

log = logging.getLogger("fedveil.fleet")

PULL_PATH = "/v1/fleet/pull-messages"
_TABLE = re.compile(r"\bmessage_ins\b")
_INSERT = re.compile(r"\s*INSERT INTO message_ins \(([^)]*)\) VALUES", re.IGNORECASE)
# Flower's claim (SqlLinkState._claim_message_ins_rows): it only marks rows delivered.
_CLAIM = "UPDATE message_ins SET delivered_at=? WHERE"
_READ_OR_DELETE = re.compile(r"\s*(SELECT|DELETE FROM message_ins\b)", re.IGNORECASE)
_PENDING_SQL = (
    "SELECT dst_node_id, MAX(created_at + ttl) AS until FROM message_ins "
    "WHERE delivered_at = '' GROUP BY dst_node_id"
)


def _expiry(created_at: Any, ttl: Any) -> float:
    """created_at + ttl, or infinity (busy for good) where either is not a finite number."""
    try:
        until = float(created_at) + float(ttl)
    except (TypeError, ValueError):
        return math.inf
    return until if math.isfinite(until) else math.inf


class PendingMessages:
    """Per destination node (Flower's signed int64 form, as stored), the latest
    `created_at + ttl` of the messages written for it; every node busy until `prime`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[int, float] = {}
        self._all_until = math.inf  # every node busy until then: not primed yet
        self._poisoned = False  # an unreadable write was seen: busy for good

    def note(self, node: int, until: float) -> None:
        with self._lock:
            # max() would keep a NaN; _expiry already turned those into infinity.
            if not (self._until.get(node, -math.inf) >= until):
                self._until[node] = until

    def poison(self, why: str) -> None:
        with self._lock:
            first = not self._poisoned
            self._poisoned = True
            self._all_until = math.inf
        if first:
            log.warning("idle polls go to Flower's path from now on: %s", why)

    def prime(self, rows: Iterable[tuple[Any, Any]]) -> None:
        """The undelivered messages already stored: (dst_node_id, created_at + ttl) rows."""
        for node, until in rows:
            try:
                self.note(int(node), _expiry(until, 0.0))
            except (TypeError, ValueError):
                self.poison(f"a stored message has dst_node_id {node!r}")
        with self._lock:
            if not self._poisoned:
                self._all_until = -math.inf

    def quiet(self, node: int, now: float) -> bool:
        """True only if no message for `node` can be deliverable at `now`."""
        with self._lock:
            if not (now >= self._all_until):
                return False
            until = self._until.get(node)
            if until is None:
                return True
            if now >= until:
                del self._until[node]  # expired for good: Flower will never deliver it
                return True
            return False


def record_write(index: PendingMessages, statement: str, parameters: Any, many: bool) -> None:
    """What one SQL statement about to run does to the index (see the module docstring)."""
    if not _TABLE.search(statement):
        return
    insert = _INSERT.match(statement)
    if insert is None:
        if _CLAIM in statement or _READ_OR_DELETE.match(statement):
            return
        index.poison(f"unrecognised write to message_ins: {statement[:120]!r}")
        return
    columns = [c.strip().strip('"') for c in insert.group(1).split(",")]
    rows: Sequence[Any] = parameters if many else [parameters]
    try:
        dst, created, ttl = (columns.index(c) for c in ("dst_node_id", "created_at", "ttl"))
        width = len(columns)
        for params in rows:
            # Named parameters by column name; positional ones (SQLite's) in column order.
            values = [params[c] for c in columns] if isinstance(params, dict) else list(params)
            if not values or len(values) % width:
                raise ValueError(f"{len(values)} parameters for {width} columns")
            for i in range(0, len(values), width):  # multi-row VALUES
                row = values[i : i + width]
                index.note(int(row[dst]), _expiry(row[created], row[ttl]))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        index.poison(f"an INSERT into message_ins not read ({exc})")


def watch_message_writes(index: PendingMessages) -> None:
    """Every SQL statement of every engine in this process passes `record_write` first."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def before(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool
    ) -> None:
        try:
            record_write(index, statement, parameters, many)
        except Exception as exc:  # never break Flower's statement
            index.poison(f"{type(exc).__name__} while reading a statement")

    event.listen(Engine, "before_cursor_execute", before)


def watched_index(superlink_app: Any) -> PendingMessages | None:
    """The index for `superlink_app`'s LinkState, listening from now on and primed with
    the stored messages; None (no idle poll answered from memory) where that state is
    not SQL (Flower's in-memory LinkState writes no statement to listen to).

    Call it before the app serves a request, so that no write can come before the listener.
    """
    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    factory = getattr(superlink_app.state, "linkstate_factory", None)
    state = None if factory is None else factory.state()
    if not isinstance(state, SqlLinkState):
        return None
    index = PendingMessages()
    watch_message_writes(index)
    index.prime(pending_rows(state))
    return index


def pending_rows(state: Any) -> list[tuple[Any, Any]]:
    """The stored undelivered messages' (dst_node_id, latest created_at + ttl), read with
    Flower's own query method (SqlLinkState.query)."""
    return [(r["dst_node_id"], r["until"]) for r in state.query(_PENDING_SQL)]


class IdlePolls:
    """Answers a quiet node's PullMessages (see the module docstring); None: not answered
    here, the caller passes the request to Flower's Fleet routes."""

    def __init__(
        self, auth_app: Any, index: PendingMessages, on_answer: Callable[[], None]
    ) -> None:
        from flwr.proto.fleet_pb2 import PullMessagesResponse
        from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE

        self._app = auth_app  # request.app for authenticate_node: its state's LinkState
        self._index = index
        self._on_answer = on_answer  # counted for /metrics
        # What Flower's ProtobufTranslationMiddleware sends for an empty pull.
        self._empty = PullMessagesResponse().SerializeToString()
        self._headers = [(b"content-type", PROTOBUF_MEDIA_TYPE.encode())]

    async def answer(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse | None:
        if path != PULL_PATH:
            return None
        from flwr.proto.fleet_pb2 import PullMessagesRequest
        from flwr.supercore.utils import uint64_to_int64

        pull = protobuf_body(PullMessagesRequest, body, headers)
        if pull is None:
            return None
        try:
            node = uint64_to_int64(pull.node.node_id)
        except (ValueError, OverflowError):
            return None
        if not self._index.quiet(node, time.time()):
            return None
        if not await authenticated(self._app, path, headers, pull):
            return None
        # Checked again after the (threaded) authentication: the answer is as of now.
        if not self._index.quiet(node, time.time()):
            return None
        self._on_answer()
        return UpstreamResponse(200, list(self._headers), self._empty)


def protobuf_body(message_type: Any, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    """`body` parsed as `message_type`, or None where Flower's path must decide: a
    content encoding, a media type not Flower's protobuf one, or bytes that do not parse."""
    from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE
    from google.protobuf.message import DecodeError

    content_type = b""
    for name, value in headers:
        if name.lower() == b"content-encoding":
            return None  # Flower's path decides what it accepts
        if name.lower() == b"content-type":
            content_type = value
    media = content_type.decode("latin-1").partition(";")[0].strip().lower()
    if media != PROTOBUF_MEDIA_TYPE:
        return None
    message = message_type()
    try:
        message.ParseFromString(body)
    except DecodeError:
        return None
    return message


async def authenticated(
    auth_app: Any, path: str, headers: list[tuple[bytes, bytes]], message: Any
) -> bool:
    """Whether Flower's own `authenticate_node` passes on this request (called, not
    copied: signature, time window, registered key, the key's node id). False on any
    refusal or error: the request then goes down Flower's path, which answers it."""
    from flwr.superlink.routers.fleet.node_auth import authenticate_node
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request

    request = Request(
        {
            "type": "http",
            "method": "POST",
            "path": path,
            "headers": headers,
            "app": auth_app,
            "query_string": b"",
        }
    )
    request.state.protobuf_request = message
    try:
        await run_in_threadpool(authenticate_node, request)
    except HTTPException:
        return False  # refused: Flower's path refuses it again, with its own answer
    except Exception:  # e.g. SQLite busy: Flower's path answers it
        return False
    return True
