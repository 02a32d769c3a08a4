"""Held connections, measured: uvicorn's stock httptools protocol against fedveil's
guarded one (server/serving/connections.py), on the same small app.

    .venv/bin/python -m fedveil.benchmarks.held_connections [--held 200] [--timeout 2]

One peer (127.0.0.2) opens --held connections and sends partial headers; then another
(127.0.0.1) asks GET /. Printed per protocol: how many held connections the server cut
at once, how many are still open after --timeout + 1 s, and how long the other peer's
request took (or its error)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
import urllib.request
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from fedveil.server.serving.connections import ConnectionLimits, guarded_http


def _app() -> Starlette:
    async def root(_: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/", root)])


def _open(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) != b""
    except TimeoutError:
        return True
    except OSError:
        return False


def measure(http: Any, held: int, timeout: float) -> dict[str, Any]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(), http=http, log_level="error", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve([listener])), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    socks = []
    for _ in range(held):
        s = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    time.sleep(0.5)
    open_now = sum(_open(s) for s in socks)
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            other = f"{r.status} in {1000 * (time.perf_counter() - start):.1f} ms"
    except OSError as exc:
        other = f"failed: {exc}"
    time.sleep(timeout + 1)
    open_later = sum(_open(s) for s in socks)
    for s in socks:
        s.close()
    server.should_exit = True
    thread.join(10)
    return {
        "cut_at_once": held - open_now,
        f"open_after_{timeout + 1:g}s": open_later,
        "other_peer": other,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--held", type=int, default=200)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--per-peer", type=int, default=32)
    a = p.parse_args()
    limits = ConnectionLimits(512, a.per_peer, a.timeout)
    out = {
        "held": a.held,
        "uvicorn httptools": measure("httptools", a.held, a.timeout),
        f"guarded (per peer {a.per_peer}, timeout {a.timeout:g} s)": measure(
            guarded_http(limits), a.held, a.timeout
        ),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
