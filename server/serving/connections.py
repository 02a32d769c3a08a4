"""Bounded connections for uvicorn: a count per listener and per peer, and a deadline on
each request's arrival, which uvicorn 0.49 does not have.

uvicorn's `limit_concurrency` answers 503 only once a request's headers are parsed, counts
all listeners together and never closes a held connection; `timeout_keep_alive` runs only
between requests. `guarded_http(limits)` is an httptools protocol class for
`uvicorn.Config(http=...)` that adds, per server:

- at most `max_per_listener` open connections per listening port, and at most
  `max_per_peer` from one peer address on one port: a connection past either is closed
  at once, before a byte is read;
- at most the process's file-descriptor limit less `FD_RESERVE` connections in all, so
  the state files, logs and the SuperLink's sockets always have descriptors left;
- a deadline of `request_timeout_s` from a connection's start (after the TLS handshake,
  which asyncio bounds at 60 s) or a request's first byte to its last byte: a client
  that sends headers or a body too slowly is disconnected. The time the app takes to
  answer is not bounded here;
- at most `MAX_HEAD_BYTES` of a request's line and headers: past that it is answered 431
  and the connection closed. uvicorn (and httptools under it) buffers headers without
  limit until they end, so before this one connection could make the process hold
  gigabytes (1,000 MiB of headers in 4 s on loopback: +1 GiB of memory) within the
  deadline.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("fedveil.connections")

FD_RESERVE = 256  # descriptors never given to connections
# A request's line and headers, at most (a bearer token or Flower's signed headers are
# a few KiB; nginx's default is 32 KiB, h11's 16 KiB).
MAX_HEAD_BYTES = 64 * 1024
HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)


@dataclass(frozen=True)
class ConnectionLimits:
    max_per_listener: int = 512
    max_per_peer: int = 32
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_per_listener <= 1_000_000:
            raise ValueError(f"max connections = {self.max_per_listener}: must be in [1, 1e6]")
        if not 1 <= self.max_per_peer <= self.max_per_listener:
            raise ValueError(
                f"max connections per peer = {self.max_per_peer}: must be in "
                f"[1, {self.max_per_listener}] (the per-listener limit)"
            )
        if not 0.1 <= self.request_timeout_s <= 3600:  # NaN fails too
            raise ValueError(
                f"request timeout = {self.request_timeout_s}: must be in [0.1, 3600] s"
            )


def fd_budget() -> int:
    """Connections the process may hold in all: its open-file limit less FD_RESERVE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft - FD_RESERVE)


class ConnectionCounts:
    """Open connections per listening port and per (port, peer address), and refusals."""

    def __init__(self) -> None:
        self.total = 0
        self.per_listener: Counter[int] = Counter()
        self.per_peer: Counter[tuple[int, str]] = Counter()
        self.refused = 0
        self.timed_out = 0
        self.head_too_large = 0


def guarded_http(
    limits: ConnectionLimits, counts: ConnectionCounts | None = None
) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)` under `limits`; `counts` (shared by
    every connection of the server) can be read for metrics and tests."""
    shared = counts if counts is not None else ConnectionCounts()
    budget = fd_budget()

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._key: tuple[int, str] | None = None
            self._deadline: asyncio.TimerHandle | None = None
            self._in_head = True  # the request line and headers are arriving
            self._head_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            port = self.server[1] if self.server and self.server[1] is not None else 0
            key = (int(port), self.client[0] if self.client else "?")
            if (
                shared.total >= budget
                or shared.per_listener[key[0]] >= limits.max_per_listener
                or shared.per_peer[key] >= limits.max_per_peer
            ):
                shared.refused += 1
                if shared.refused in (1, 10, 100) or shared.refused % 1000 == 0:
                    log.warning(
                        "connection from %s to port %d refused: %d open there, %d from it "
                        "(limits %d per listener, %d per peer, %d in all); %d refused so far",
                        key[1],
                        key[0],
                        shared.per_listener[key[0]],
                        shared.per_peer[key],
                        limits.max_per_listener,
                        limits.max_per_peer,
                        budget,
                        shared.refused,
                    )
                transport.abort()
                return
            self._key = key
            shared.total += 1
            shared.per_listener[key[0]] += 1
            shared.per_peer[key] += 1
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.request_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.transport is not None and not self.transport.is_closing():
                shared.timed_out += 1
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._in_head:
                return
            # The headers have not ended: every byte of this chunk was head (the parser
            # holds at most this one chunk past the limit before it is refused).
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                shared.head_too_large += 1
                message = (
                    f"request line and headers over the {MAX_HEAD_BYTES}-byte limit"
                ).encode()
                self.transport.write(HEAD_TOO_LARGE % (len(message), message))
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0
            if self._deadline is None:  # the next request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()  # all of it arrived: the app's time is its own

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._key is not None:
                shared.total -= 1
                shared.per_listener[self._key[0]] -= 1
                shared.per_peer[self._key] -= 1
                if not shared.per_peer[self._key]:
                    del shared.per_peer[self._key]
                self._key = None
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol
