"""Large unauthenticated bodies cannot grow the coordinator's memory without bound
(issue 31): the Fleet gateway, served by uvicorn on loopback, reserves each request's
declared body before reading it and answers 503, unread, past its total. Six
concurrent 60 MiB bodies used to raise the coordinator's RSS by 1.2 GB."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from loopback_ports import free_port

from fedveil.server.coordinator.gateway import FleetGateway
from fedveil.server.coordinator.metrics import ServiceCounters

MIB = 1024 * 1024


def _serve(gateway: FleetGateway) -> tuple[uvicorn.Server, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(gateway, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)
    return server, port


def _start_upload(port: int, length: int) -> socket.socket:
    """Headers declaring `length` body bytes and the first 1 KiB of it; the rest held."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST /v1/fleet/push-messages HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
        "Content-Type: application/protobuf\r\n\r\n"
    )
    conn.sendall(head.encode() + b"\0" * 1024)
    return conn


def _status(conn: socket.socket, timeout: float) -> int | None:
    conn.settimeout(timeout)
    try:
        data = conn.recv(4096)
    except TimeoutError:
        return None
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1") else None


def test_bodies_past_the_gateways_total_are_refused_unread():
    counters = ServiceCounters()
    # The coordinator's defaults scaled down: 60 MiB bodies, 256 MiB held at most.
    gateway = FleetGateway("http://superlink", False, 64 * MIB, counters, uds="/nonexistent")
    server, port = _serve(gateway)
    held: list[socket.socket] = []
    try:
        for _ in range(4):  # 4 x 60 MiB = 240 MiB reserved: each is being read
            held.append(_start_upload(port, 60 * MIB))
        deadline = time.monotonic() + 10
        while gateway.buffered < 4 * 60 * MIB:
            assert time.monotonic() < deadline, gateway.buffered
            time.sleep(0.02)
        for conn in held:
            assert _status(conn, 0.3) is None  # still uploading, nothing answered
        fifth = _start_upload(port, 60 * MIB)
        assert _status(fifth, 5) == 503  # refused at once, its body never read
        fifth.close()
        assert counters.fleet_rejected["busy"] == 1
        assert gateway.buffered == 4 * 60 * MIB
        for conn in held:
            conn.close()
        deadline = time.monotonic() + 10
        while gateway.buffered:  # the uploads ended: their reservations are released
            assert time.monotonic() < deadline, gateway.buffered
            time.sleep(0.02)
    finally:
        for conn in held:
            conn.close()
        server.should_exit = True
