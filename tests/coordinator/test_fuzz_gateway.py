"""Fuzzing the Fleet gateway (issue 18): random and mutated HTTP requests, driven through its
ASGI app in-process, with a real HTTP upstream (uvicorn on a Unix socket, as the SuperLink
is reached in deployment) that records what reaches it.

Every request must get exactly one response, within a time bound (10 s wall), with no exception out
of the gateway; nothing but well-formed `POST /v1/fleet/*` requests may reach the upstream;
and the valid requests interleaved with the fuzz must all reach it exactly once, byte for
byte, and get its answer back: the service keeps running and loses nothing it accepted.
The upstream stands in for the SuperLink (a real one costs seconds per start and has its
own parser; what is fuzzed here is the gateway's).

FEDVEIL_FUZZ_MESSAGES sets the request count, FEDVEIL_FUZZ_SEED replays a run.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fuzzing import FuzzRun, fuzz_count, fuzz_seed, mutate_bytes

from fedveil.server.coordinator.gateway import FleetGateway
from fedveil.server.coordinator.metrics import ServiceCounters

DEFAULT_MESSAGES = 1_000
MAX_BODY = 4096
FLEET_PATHS = ("/v1/fleet/pull-messages", "/v1/fleet/push-messages", "/v1/fleet/create-node")
VALID_EVERY = 10  # one genuine request among every this many
# Wall time per request (upstream round trip included), generous for a busy shared machine.
CALL_LIMIT_WALL_S = 10.0


class Upstream:
    """A recording HTTP server: answers 200 with the body's SHA-256, keeps every request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, list[tuple[bytes, bytes]]]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.seen.append((scope["path"], body, list(scope["headers"])))
        digest = hashlib.sha256(body).hexdigest().encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": digest})


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[Upstream, str]]:
    app = Upstream()
    path = str(tmp_path / "link.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "upstream did not start"
        time.sleep(0.02)
    yield app, path
    server.should_exit = True
    thread.join(10)


class Exchange:
    """What one request made the gateway send back."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        bodies = [m for m in self.messages if m["type"] == "http.response.body"]
        assert len(starts) == 1 and len(bodies) == 1, f"not one response: {self.messages}"
        return int(starts[0]["status"])

    @property
    def body(self) -> bytes:
        return next(m["body"] for m in self.messages if m["type"] == "http.response.body")


def _receiver(chunks: list[dict[str, Any]]) -> Any:
    queue = list(chunks)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(0)
        return {"type": "http.disconnect"}

    return receive


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "https",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": b"",
        "headers": headers,
        "client": ("203.0.113.9", 40000),
        "server": ("127.0.0.1", 9092),
    }


def _valid_request(run: FuzzRun, index: int) -> tuple[dict[str, Any], list[dict[str, Any]], bytes]:
    body = b"genuine %d " % index + run.rng.randbytes(run.rng.randrange(0, 64))
    headers = [
        (b"content-type", b"application/protobuf"),
        (b"content-length", str(len(body)).encode()),
        (b"x-flower-node-signature", run.rng.randbytes(16).hex().encode()),
    ]
    chunks = [{"type": "http.request", "body": body, "more_body": False}]
    return _scope("POST", run.rng.choice(FLEET_PATHS), headers), chunks, body


def _fuzzed_path(run: FuzzRun) -> str:
    rng = run.rng
    base = rng.choice((*FLEET_PATHS, "/v1/control/stop-run", "/", "", "/v1/fleet/"))
    raw = mutate_bytes(rng, base.encode()) if rng.random() < 0.7 else base.encode()
    extra = rng.choice(
        (
            "",
            "/../control",
            "?x=1",
            "#frag",
            " ",
            "\x00",
            "%2e%2e",
            "/\r\nHost: evil",
            "é",
            "\ud800",
        )
    )
    return raw.decode("latin-1") + extra


def _fuzzed_request(run: FuzzRun) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """A random or mutated request: method, path, headers, body size and chunking."""
    rng = run.rng
    scope, chunks, _ = _valid_request(run, -1)
    what = rng.randrange(6)
    if what == 0:
        scope["method"] = rng.choice(("GET", "PUT", "post", "", "POST ", "\x00", "CONNECT"))
    if what in (1, 5):
        scope["path"] = _fuzzed_path(run)
    if what in (2, 5):
        name = rng.choice(
            (b"content-length", b"transfer-encoding", b"host", b"x-forwarded-for", b"x", b"")
        )
        value = rng.choice(
            (
                b"-1",
                b"99999999999999999999999",
                b"1_0",
                b"\xff",
                b"",
                b"9" * 5000,
                b"chunked",
                b"a\r\nb",
                mutate_bytes(rng, b"12"),
            )
        )
        scope["headers"] = [*scope["headers"], (name, value)]
    if what in (3, 5):
        size = rng.choice((0, MAX_BODY, MAX_BODY + 1, 3 * MAX_BODY, rng.randrange(2 * MAX_BODY)))
        body = rng.randbytes(size)
        cut = rng.randrange(len(body) + 1)
        chunks = [
            {"type": "http.request", "body": body[:cut], "more_body": True},
            {"type": "http.request", "body": body[cut:], "more_body": rng.random() < 0.1},
        ]
    if what == 4:
        chunks = rng.choice(
            (
                [{"type": "http.disconnect"}],
                [{"type": "http.request", "body": b"x", "more_body": True}],
                [{"type": "http.request"}],
            )
        )
    return scope, chunks, repr((scope["method"], scope["path"], scope["headers"][-1:], what))


def test_fuzz_gateway(upstream: tuple[Upstream, str], record_property: Any) -> None:
    recorder, uds = upstream
    counters = ServiceCounters()
    gateway = FleetGateway("http://superlink", False, MAX_BODY, counters, uds=uds)
    run = FuzzRun("gateway", fuzz_count(DEFAULT_MESSAGES), fuzz_seed(), record_property)
    genuine: list[bytes] = []
    statuses: dict[int, int] = {}

    async def one(scope: dict[str, Any], chunks: list[dict[str, Any]]) -> Exchange:
        exchange = Exchange()
        await asyncio.wait_for(
            gateway(scope, _receiver(chunks), exchange.send), timeout=CALL_LIMIT_WALL_S
        )
        return exchange

    async def campaign() -> None:
        loop = asyncio.get_running_loop()
        for i in range(run.count):
            valid = i % VALID_EVERY == 0
            if valid:
                scope, chunks, body = _valid_request(run, i)
                shown = f"genuine request #{i}"
            else:
                scope, chunks, shown = _fuzzed_request(run)
            started = loop.time()
            try:
                exchange = await one(scope, chunks)
                status = exchange.status
            except Exception as exc:  # any exception out of the gateway is a crash
                pytest.fail(f"{run.replay_hint(i)}: {type(exc).__name__}: {exc}; input {shown}")
            elapsed = loop.time() - started
            assert elapsed < CALL_LIMIT_WALL_S, f"{run.replay_hint(i)}: {elapsed:.1f} s for {shown}"
            run.slowest_s = max(run.slowest_s, elapsed)
            statuses[status] = statuses.get(status, 0) + 1
            outcome = "forwarded" if status == 200 else f"refused {status}"
            run.outcomes[outcome] = run.outcomes.get(outcome, 0) + 1
            if valid:
                assert status == 200, f"{run.replay_hint(i)}: genuine request got {status}"
                assert exchange.body == hashlib.sha256(body).hexdigest().encode()
                genuine.append(body)
        await gateway.aclose()

    asyncio.run(campaign())
    # Only Fleet requests reached the upstream, and every genuine one exactly once, intact.
    for path, _, headers in recorder.seen:
        assert path.startswith("/v1/fleet/") and ".." not in path, f"{run.seed}: {path!r}"
        names = [name for name, _ in headers]
        assert names.count(b"content-length") <= 1, f"{run.seed}: {headers}"
    bodies = [body for _, body, _ in recorder.seen]
    for body in genuine:
        assert bodies.count(body) == 1, f"seed {run.seed}: genuine body lost or doubled"
    # Every request is counted once: forwarded (the upstream's answer went back, whatever
    # its status; its own parser may still refuse one) or refused by the gateway.
    with counters.lock:
        forwarded, refused = counters.fleet_requests, sum(counters.fleet_rejected.values())
    assert forwarded + refused == run.count, f"seed {run.seed}: {counters}"
    assert statuses.get(200, 0) == len(recorder.seen) <= forwarded, f"seed {run.seed}"
    record_property("fuzz_gateway_statuses", statuses)
    run.report(messages=run.count)


def test_gateway_refuses_odd_paths_and_headers_by_status(upstream: tuple[Upstream, str]) -> None:
    """Regressions found by the fuzz: a NUL in the path raised httpx.InvalidURL out of the
    gateway; headers that cannot be sent on were a 503 'restarting; retry'."""
    recorder, uds = upstream
    counters = ServiceCounters()
    gateway = FleetGateway("http://superlink", False, MAX_BODY, counters, uds=uds)
    body = [{"type": "http.request", "body": b"x", "more_body": False}]

    async def status(path: str, headers: list[tuple[bytes, bytes]]) -> int:
        exchange = Exchange()
        await gateway(_scope("POST", path, headers), _receiver(body), exchange.send)
        return exchange.status

    async def main() -> list[int]:
        try:
            return [
                await status("/v1/fleet/pull-messages\x00", []),
                await status("/v1/fleet/%2e%2e/control/list-runs", []),
                await status("/v1/fleet/pull-messages", [(b"x", b"a\r\nb")]),
                await status("/v1/fleet/pull-messages", [(b"", b"1")]),
                await status("/v1/fleet/pull-messages", []),
            ]
        finally:
            await gateway.aclose()

    assert asyncio.run(main()) == [404, 404, 400, 400, 200]
    assert [path for path, _, _ in recorder.seen] == ["/v1/fleet/pull-messages"]
