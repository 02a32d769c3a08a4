"""The Fleet API gateway: the only part of the SuperLink that devices can reach.

flwr 1.41 serves its Control API (start runs, register SuperNode keys), its
Runtime API (ServerApps) and the Fleet API (SuperNodes) on one port. The
SuperLink therefore listens on an owner-only Unix socket (link_socket.py), and
this gateway passes on exactly the Fleet routes (`POST /v1/fleet/*`), nothing
else, after checking the body size; requests and bytes are counted for /metrics.
SuperNode authentication is end to end: the signed headers reach Flower's check
as sent.

Where it passes them is its upstream (`FleetUpstream`): in `fedveil server` it is
`fleet_listener.LocalFleet`, Flower's Fleet routes called in the SuperLink's own
process (no second HTTP hop); with only a URL, an `UpstreamPool` of HTTP
connections to a SuperLink elsewhere.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import httpcore

from fedveil.server.coordinator.metrics import ServiceCounters
from fedveil.server.coordinator.upstream_pool import (
    UPSTREAM_ERRORS,
    UpstreamPool,
    UpstreamResponse,
)

log = logging.getLogger("fedveil.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Flower's Fleet routes are `/v1/fleet/<lower-case-words>`; anything else (percent escapes the
# SuperLink would decode again, "..", NUL, non-ASCII) is refused before it becomes a URL.
_FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]*")
_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive", b"upgrade"}

# Upstream connections are kept and reused: each new one costs a TLS handshake on both
# sides. The pool (upstream_pool.py) keeps every connection it opens, and lets an idle
# one go well before the SuperLink's keep-alive timeout (link_socket.SUPERLINK_KEEP_ALIVE_S),
# so the gateway never sends on a connection the SuperLink is closing at that moment.
# 16 connections: more parallel requests would not make the SuperLink (one event loop)
# any faster.
UPSTREAM_CONNECTIONS = 16
UPSTREAM_IDLE_S = 30.0
# The bytes of request bodies the gateway holds at once, across requests: each request
# reserves its declared Content-Length (the body limit when it declares none) before a
# byte is read, and keeps the reservation until its answer is sent. A request that would
# pass it is answered 503 at once, unread: concurrent large bodies, which need no
# credentials, cannot grow the coordinator's memory past this.
MAX_BUFFERED_BYTES = 256 * 1024 * 1024


class FleetUpstream(Protocol):
    """Where the gateway passes a checked Fleet request: the whole body in, the whole
    response out, headers as raw (lower-case name, value) pairs."""

    async def post(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


async def send_json(send: Send, status: int, detail: str) -> None:
    body = ('{"detail": "' + detail.replace('"', "'") + '"}').encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, if it declares a well-formed one."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return max(0, int(value))
            except ValueError:
                return None
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None if it is (or announces itself) larger than `limit`."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                if int(value) > limit:
                    return None
            except ValueError:
                return None
    chunks, total = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class FleetGateway:
    def __init__(
        self,
        upstream: str,
        verify: ssl.SSLContext | bool,
        max_body_bytes: int,
        counters: ServiceCounters,
        uds: str | None = None,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
        local: FleetUpstream | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.max_buffered = max(max_buffered_bytes, max_body_bytes)
        self.buffered = 0  # bytes reserved by requests in progress (one event loop: no lock)
        self._uds = uds  # the SuperLink's socket; `upstream` then only names the URL
        self.max_body = max_body_bytes
        self.counters = counters
        self._verify = verify
        self._pool: FleetUpstream | None = local

    def pool(self) -> FleetUpstream:
        if self._pool is None:
            self._pool = UpstreamPool(
                self.upstream,
                self._verify,
                uds=self._uds,
                size=UPSTREAM_CONNECTIONS,
                idle_s=UPSTREAM_IDLE_S,
                timeout_s=120.0,
                connect_timeout_s=5.0,
            )
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    def _reject(self, reason: str) -> None:
        self.counters.fleet_refused(reason)

    async def _forward(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        """POST to the SuperLink, sent a second time only if the first connection was closed
        before a single response byte came back (httpcore.RemoteProtocolError: "Server
        disconnected without sending a response").

        Why the retry is safe: uvicorn closes a kept-alive connection only while it is idle
        (its keep-alive timer is cancelled as soon as request bytes arrive), so a close with
        no response means the request was dropped unread, or the SuperLink died mid-request.
        Pull, heartbeat, activate and PullObject are reads or idempotent writes; a push that
        did reach the store before the SuperLink died is found again by its message id,
        which is the hash of its content (SqlLinkState.store_message_res returns the stored
        id on such a retry; PushObject stores by content hash too). The body is already in
        memory, so it can be sent again as is. Any other error, or a second failure,
        is the caller's 503.
        """
        pool = self.pool()
        try:
            return await pool.post(path, body, headers)
        except httpcore.RemoteProtocolError as exc:
            log.info("Fleet request %s: SuperLink closed the connection (%s); retrying", path, exc)
            return await pool.post(path, body, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if scope["method"] != "POST" or not _FLEET_PATH.fullmatch(path):
            self._reject("not_fleet")
            await send_json(send, 404, "not found: this port serves the Fleet API only")
            return
        declared = declared_length(scope)
        reserve = self.max_body if declared is None else min(declared, self.max_body + 1)
        if self.buffered + reserve > self.max_buffered:
            self._reject("busy")
            await send_json(
                send,
                503,
                f"the gateway holds {self.buffered} bytes of request bodies; this one would "
                f"pass its {self.max_buffered}-byte limit: retry",
            )
            return
        self.buffered += reserve
        try:
            await self._serve(scope, receive, send, path)
        finally:
            self.buffered -= reserve

    async def _serve(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        body = await read_body(scope, receive, self.max_body)
        if body is None:
            self._reject("too_large")
            await send_json(send, 413, f"request body over the {self.max_body}-byte limit")
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        client = scope.get("client")
        if client:
            headers.append((b"x-forwarded-for", str(client[0]).encode()))
        try:
            resp = await self._forward(path, body, headers)
        except httpcore.LocalProtocolError as exc:  # the device's headers cannot be sent on
            self._reject("bad_request")
            log.info("Fleet request %s: malformed headers refused: %s", path, exc)
            await send_json(send, 400, "malformed request headers")
            return
        except UPSTREAM_ERRORS as exc:
            self._reject("upstream")
            log.warning(
                "Fleet request %s: SuperLink unreachable: %s", path, exc or type(exc).__name__
            )
            await send_json(send, 503, "the coordinator is starting or restarting; retry")
            return
        content = resp.content
        self.counters.fleet_served(len(body), len(content))
        # The body goes back as it came (not decoded), with its own Content-Encoding if any.
        out_headers = [(k, v) for k, v in resp.headers if k.lower() not in _HOP]
        out_headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
        await send({"type": "http.response.body", "body": content})
