"""The gateway's connections to the SuperLink: kept and reused under a burst, and a request
whose connection the SuperLink closed before any response byte is sent once more.

The upstream is a real HTTP/1.1 server on a Unix socket (asyncio streams), which can be
told to drop a connection after reading a request, as uvicorn does to an idle kept-alive
connection that a request reaches just as its keep-alive timer fires.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.server.coordinator.gateway import UPSTREAM_CONNECTIONS, FleetGateway
from fedveil.server.coordinator.metrics import ServiceCounters


@dataclass
class Upstream:
    connections: int = 0
    requests: int = 0
    drop_next: int = 0  # connections to close right after reading their request
    close_after_answer: bool = False  # close each connection once it has answered
    bodies: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                if self.drop_next:
                    self.drop_next -= 1
                    writer.close()
                    return
                self.requests += 1
                self.bodies.append(body)
                await asyncio.sleep(0.05)  # long enough for a burst to overlap
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                if self.close_after_answer:  # as uvicorn's keep-alive timer does, idle
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


class Exchange:
    def __init__(self) -> None:
        self.status = 0

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]


def _receiver(body: bytes) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/fleet/pull-messages",
        "headers": [(b"content-length", b"4")],
        "client": ("127.0.0.1", 5000),
    }


async def _post(gateway: FleetGateway, body: bytes = b"pull") -> int:
    exchange = Exchange()
    await gateway(_scope(), _receiver(body), exchange.send)
    return exchange.status


def _run(test: Callable[[Upstream, FleetGateway], Awaitable[None]]) -> None:
    async def main() -> None:
        upstream = Upstream()
        with tempfile.TemporaryDirectory() as tmp:
            sock = str(Path(tmp) / "link.sock")
            server = await asyncio.start_unix_server(upstream.serve, path=sock)
            gateway = FleetGateway("http://superlink", False, 1 << 20, ServiceCounters(), uds=sock)
            try:
                await test(upstream, gateway)
            finally:
                await gateway.aclose()
                server.close()
                await server.wait_closed()

    asyncio.run(main())


def test_a_burst_reuses_the_connections_of_the_burst_before() -> None:
    """100 devices polling at once, twice: the gateway holds a bounded set of connections
    and the second burst opens no new one (each new one is a TLS handshake on both sides;
    httpx's default pool opened up to 100 and kept only 20)."""

    async def test(upstream: Upstream, gateway: FleetGateway) -> None:
        first = await asyncio.gather(*(_post(gateway) for _ in range(100)))
        opened = upstream.connections
        second = await asyncio.gather(*(_post(gateway) for _ in range(100)))
        assert first == second == [200] * 100
        assert 1 < opened <= UPSTREAM_CONNECTIONS, f"{opened} upstream connections"
        assert upstream.connections == opened, (
            f"second burst opened {upstream.connections - opened} new connections"
        )

    _run(test)


def test_a_request_dropped_unanswered_is_sent_once_more() -> None:
    """The SuperLink closes the connection before any response byte: the device gets the
    answer of a second attempt, not a 503, and the upstream sees the request once."""

    async def test(upstream: Upstream, gateway: FleetGateway) -> None:
        assert await _post(gateway) == 200  # a kept-alive connection now exists
        upstream.drop_next = 1
        assert await _post(gateway, b"push") == 200
        assert upstream.bodies == [b"pull", b"push"]

    _run(test)


def test_a_second_drop_is_a_503_not_a_loop() -> None:
    async def test(upstream: Upstream, gateway: FleetGateway) -> None:
        upstream.drop_next = 2
        assert await _post(gateway) == 503
        assert upstream.requests == 0
        assert upstream.drop_next == 0  # tried exactly twice
        assert await _post(gateway) == 200

    _run(test)


def test_a_connection_the_superlink_closed_while_idle_is_not_sent_on() -> None:
    """The SuperLink let a kept-alive connection go while it sat idle in the pool: the
    next request opens a new one and is answered on its first attempt (the pool checks
    the connection it takes), and the closed one is not counted against the pool."""

    async def test(upstream: Upstream, gateway: FleetGateway) -> None:
        upstream.close_after_answer = True
        for _ in range(3):
            assert await _post(gateway) == 200
            await asyncio.sleep(0.05)  # the close reaches the gateway's side
        assert upstream.requests == 3 and upstream.connections == 3
        assert gateway.pool().opened == 3

    _run(test)
