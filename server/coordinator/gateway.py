"""The Fleet API gateway: the only part of the SuperLink that devices can reach.

flwr 1.41 serves its Control API (start runs, register SuperNode keys), its
Runtime API (ServerApps) and the Fleet API (SuperNodes) on one port. The
SuperLink therefore listens on an owner-only Unix socket (link_socket.py), and
this gateway forwards to it exactly the Fleet routes (`POST /v1/fleet/*`),
nothing else, after checking the body size; requests and bytes are counted
for /metrics. SuperNode authentication is end to end: the signed headers reach
the SuperLink as sent.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx

from fedveil.server.coordinator.metrics import ServiceCounters

log = logging.getLogger("fedveil.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# Flower's Fleet routes are `/v1/fleet/<lower-case-words>`; anything else (percent escapes the
# SuperLink would decode again, "..", NUL, non-ASCII) is refused before it becomes a URL.
_FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]*")
_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive", b"upgrade"}


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
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._uds = uds  # the SuperLink's socket; `upstream` then only names the URL
        self.max_body = max_body_bytes
        self.counters = counters
        self._verify = verify
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            transport = (
                httpx.AsyncHTTPTransport(uds=self._uds, verify=self._verify)
                if self._uds is not None
                else None
            )
            self._client = httpx.AsyncClient(
                verify=self._verify, timeout=httpx.Timeout(120.0, connect=5.0), transport=transport
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _reject(self, reason: str) -> None:
        with self.counters.lock:
            self.counters.fleet_rejected[reason] += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if scope["method"] != "POST" or not _FLEET_PATH.fullmatch(path):
            self._reject("not_fleet")
            await send_json(send, 404, "not found: this port serves the Fleet API only")
            return
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
            resp = await self.client().post(self.upstream + path, content=body, headers=headers)
        except httpx.LocalProtocolError as exc:  # the device's headers cannot be sent on
            self._reject("bad_request")
            log.info("Fleet request %s: malformed headers refused: %s", path, exc)
            await send_json(send, 400, "malformed request headers")
            return
        except httpx.HTTPError as exc:
            self._reject("upstream")
            log.warning("Fleet request %s: SuperLink unreachable: %s", path, exc)
            await send_json(send, 503, "the coordinator is starting or restarting; retry")
            return
        content = resp.content
        with self.counters.lock:
            self.counters.fleet_requests += 1
            self.counters.fleet_bytes_in += len(body)
            self.counters.fleet_bytes_out += len(content)
        out_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.items()
            if k.lower().encode() not in _HOP and k.lower() != "content-encoding"
        ]
        out_headers.append((b"content-length", str(len(content)).encode()))
        await send(
            {"type": "http.response.start", "status": resp.status_code, "headers": out_headers}
        )
        await send({"type": "http.response.body", "body": content})
