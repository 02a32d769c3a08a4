"""A bounded pool of kept-alive HTTP/1.1 connections from the Fleet gateway to the SuperLink.

Contract: at most `size` connections exist; a request takes an idle one (the most
recently used first) or opens one while fewer than `size` exist, else waits (up to the
timeout) for one to come back; a connection whose response did not end cleanly, or that
the SuperLink closed, is closed and never reused; an idle one is let go after `idle_s`.
The response is read whole (Fleet bodies are bounded by the SuperLink) and handed back
with its raw headers: nothing is decoded on the way. Errors are httpcore's (see
`UPSTREAM_ERRORS`), or TimeoutError while waiting for a connection.

Why not httpx's pool, which the gateway used before: httpcore's AsyncConnectionPool scans
every pooled connection each time a request is queued or a response is closed (about
four and a half scans per request), and each scan asks every idle connection whether
its socket is readable (a poll and a getpeername through anyio): with 16 connections
that was the largest part of the gateway's CPU per Fleet request (`python -m
benchmarks.fleet_cost --profile`). Here a request checks the one connection it takes.
Each connection is httpcore's own (h11, TLS): no HTTP is parsed here.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore

# What a forwarded request can fail with, past the request's own headers
# (httpcore.LocalProtocolError: the gateway answers those 400).
UPSTREAM_ERRORS: tuple[type[BaseException], ...] = (
    httpcore.NetworkError,
    httpcore.TimeoutException,
    httpcore.RemoteProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ConnectionNotAvailable,
    OSError,
    TimeoutError,
)


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes


class UpstreamPool:
    def __init__(
        self,
        url: str,
        verify: ssl.SSLContext | bool,
        *,
        uds: str | None,
        size: int,
        idle_s: float,
        timeout_s: float,
        connect_timeout_s: float,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream {url!r}: must be http(s)://host[:port]")
        if parts.scheme == "https" and verify is False:
            raise ValueError(f"upstream {url!r}: https needs an SSL context to verify it")
        self._ssl = verify if isinstance(verify, ssl.SSLContext) else None
        if parts.scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._origin = httpcore.Origin(parts.scheme.encode(), parts.hostname.encode(), port)
        self._host = parts.netloc.encode()
        self._uds = uds
        self._idle_s = idle_s
        self._timeouts = {
            "connect": connect_timeout_s,
            "read": timeout_s,
            "write": timeout_s,
            "pool": timeout_s,
        }
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(size)
        self._idle: list[httpcore.AsyncHTTPConnection] = []  # a stack: newest last
        self.opened = 0  # connections opened so far (for tests and /metrics)

    def _take(self) -> tuple[httpcore.AsyncHTTPConnection, list[httpcore.AsyncHTTPConnection]]:
        """An idle live connection or a new one, and the expired ones passed over."""
        stale = []
        while self._idle:
            conn = self._idle.pop()
            if conn.has_expired() or conn.is_closed():
                stale.append(conn)
                continue
            return conn, stale
        self.opened += 1
        conn = httpcore.AsyncHTTPConnection(
            self._origin, ssl_context=self._ssl, keepalive_expiry=self._idle_s, uds=self._uds
        )
        return conn, stale

    async def post(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        """POST `body` to `path` (headers without Host and Content-Length: added here)."""
        await asyncio.wait_for(self._slots.acquire(), self._timeout_s)
        conn: httpcore.AsyncHTTPConnection | None = None
        try:
            conn, stale = self._take()
            for old in stale:
                await old.aclose()
            request = httpcore.Request(
                b"POST",
                httpcore.URL(
                    scheme=self._origin.scheme,
                    host=self._origin.host,
                    port=self._origin.port,
                    target=path.encode(),
                ),
                headers=[
                    (b"host", self._host),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                ],
                content=body,
                extensions={"timeout": self._timeouts},
            )
            response = await conn.handle_async_request(request)
            try:
                content = await response.aread()
            finally:
                await response.aclose()
            return UpstreamResponse(response.status, list(response.headers), content)
        except BaseException:
            if conn is not None:
                await conn.aclose()
                conn = None
            raise
        finally:
            if conn is not None:
                if conn.is_idle():
                    self._idle.append(conn)
                else:
                    await conn.aclose()
            self._slots.release()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()
