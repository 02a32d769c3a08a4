"""The public Fleet listener, served inside the SuperLink's own process.

Contract. `fedveil server` binds the Fleet port (fleet.host:fleet.port) and hands the
listening socket to its SuperLink child (`FleetListenerSpec`, by inherited descriptor
and one environment variable). There, next to Flower's full app on the owner-only Unix
socket, a second uvicorn server in the same event loop serves that port:

- TLS with the coordinator's public certificate (none with --insecure);
- fedveil's connection limits (server/serving/connections.py: per listener, per peer,
  a deadline on each request's arrival);
- fedveil's gateway (gateway.py): `POST /v1/fleet/*` only, the body limit, the bound on
  buffered bytes, the counters for /metrics (fleet_counters.py);
- idle polls answered from memory where sound (idle_polls.py: a PullMessages for a node
  with nothing queued, after Flower's own SuperNode authentication);
- heartbeats answered from memory and written in batches (heartbeats.py: an
  authenticated SendNodeHeartbeat noted, written with the others every 0.5 s and before
  any read of a node's liveness), both after Flower's own SuperNode authentication with
  the key's node id looked up in memory (node_keys.py);
- then, called in process, `fleet_only_app`: Flower's own Fleet router (flwr 1.42,
  `flwr.superlink.routers.fleet.router`) with the three middlewares it needs (protobuf
  translation, SuperNode authentication, Flower's error translation), on the same
  `LinkStateFactory` as the full app, so the nodes, messages and objects the ServerApp
  and the Control API see are the ones devices pull and push.

So a Fleet request is parsed once (not by the gateway and again, over a second TLS leg,
by the SuperLink) and passes three of Flower's `BaseHTTPMiddleware` layers instead of
eight: the five left out serve the Control API (authentication, licence, event log,
sensitive responses) or Flower's Fleet event-log plugin, which fedveil does not enable.
The Control and Runtime APIs stay on the Unix socket only: the public port has no route
to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Generator, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedveil.server.coordinator.fleet_counters import FleetCounterFile
from fedveil.server.coordinator.gateway import FleetGateway
from fedveil.server.coordinator.heartbeats import HeartbeatBatch, Heartbeats
from fedveil.server.coordinator.idle_polls import IdlePolls, PendingMessages
from fedveil.server.coordinator.metrics import ServiceCounters
from fedveil.server.coordinator.node_keys import AuthApp, NodeKeys
from fedveil.server.coordinator.upstream_pool import UpstreamResponse
from fedveil.server.serving.connections import ConnectionLimits, guarded_http

log = logging.getLogger("fedveil.fleet")

FLEET_ENV = "FEDVEIL_FLEET_LISTENER"
# Where `fedveil server` finds the path for a cProfile of its SuperLink child (the process
# that serves the Fleet port); it passes it on in FleetListenerSpec.profile_path.
PROFILE_ENV = "FEDVEIL_SUPERLINK_PROFILE"
# Flower's app.state entries the Fleet routes and their middlewares read.
_SHARED_STATE = ("linkstate_factory", "enable_supernode_auth", "fleet_api_type")


@dataclass(frozen=True)
class FleetListenerSpec:
    """What the SuperLink child needs to serve the Fleet port (JSON in FLEET_ENV)."""

    fd: int  # the bound, listening socket, inherited
    certfile: str | None  # None: no TLS (--insecure)
    keyfile: str | None
    max_body_bytes: int
    max_per_listener: int
    max_per_peer: int
    request_timeout_s: float
    counters_path: str
    # Set: the SuperLink process runs under cProfile (every thread) and writes the
    # statistics here when it exits (process_profile.py). For benchmarks (fleet_cost).
    profile_path: str | None = None

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, value: str) -> FleetListenerSpec:
        return cls(**json.loads(value))


def fleet_only_app(superlink_app: Any) -> Any:
    """Flower's Fleet routes alone, on `superlink_app`'s state (its LinkStateFactory)."""
    from fastapi import FastAPI
    from flwr.supercore.error.http import http_error_translator
    from flwr.supercore.protobuf.translation import ProtobufTranslationMiddleware
    from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware
    from flwr.superlink.routers.fleet.router import router as fleet_router
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware

    app = FastAPI(
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # Outermost first, in the order of Flower's own app (flwr.superlink.main).
        middleware=[
            Middleware(BaseHTTPMiddleware, dispatch=http_error_translator),
            Middleware(ProtobufTranslationMiddleware),
            Middleware(NodeAuthMiddleware),
        ],
    )
    for name in _SHARED_STATE:
        setattr(app.state, name, getattr(superlink_app.state, name))
    app.include_router(fleet_router)
    return app


class LocalFleet:
    """The gateway's upstream (gateway.FleetUpstream): an ASGI app called in process;
    with `idle`, a quiet node's PullMessages is answered from memory first
    (idle_polls.py); with `heartbeats`, an authenticated SendNodeHeartbeat is noted and
    answered, its write batched (heartbeats.py)."""

    def __init__(
        self, app: Any, idle: IdlePolls | None = None, heartbeats: Heartbeats | None = None
    ) -> None:
        self._app = app
        self._idle = idle
        self._heartbeats = heartbeats

    async def post(
        self, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> UpstreamResponse:
        if self._idle is not None:
            answer = await self._idle.answer(path, body, headers)
            if answer is not None:
                return answer
        if self._heartbeats is not None:
            answer = await self._heartbeats.answer(path, body, headers)
            if answer is not None:
                return answer
        scope: MutableMapping[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "https",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-length", str(len(body)).encode()), *headers],
            "client": None,
            "server": None,
        }
        answered = asyncio.Event()
        delivered = False
        status = 500
        out_headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await answered.wait()  # the client "disconnects" once it has the answer
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, out_headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                out_headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))
                if not message.get("more_body", False):
                    answered.set()

        try:
            await self._app(scope, receive, send)
        finally:
            answered.set()
        return UpstreamResponse(status, out_headers, b"".join(chunks))

    async def aclose(self) -> None:
        return None


def follower_server(config: Any) -> Any:
    """A uvicorn.Server that leaves the signals to the server it runs next to: that one
    stops on SIGTERM/SIGINT, and this one is stopped with it (`serve_with_fleet`)."""
    import uvicorn

    class FollowerServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield

    return FollowerServer(config)


def fleet_server(
    superlink_app: Any,
    spec: FleetListenerSpec,
    index: PendingMessages | None = None,
    heartbeats: HeartbeatBatch | None = None,
    keys: NodeKeys | None = None,
) -> tuple[Any, socket.socket]:
    """The uvicorn server for the Fleet port, and the inherited socket it serves; with
    `index` (idle_polls.watched_index), idle polls are answered from memory; with
    `heartbeats` (heartbeats.batched_heartbeats), heartbeats are written in batches; with
    `keys` (node_keys.watched_keys), those two paths look a key's node id up in memory."""
    import uvicorn

    # The gateway's refusals and upstream errors go to the SuperLink's output (its log file,
    # superlink.log), named, as `fedveil server` logs them; Flower configures only "flwr".
    fedveil_log = logging.getLogger("fedveil")
    if not fedveil_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        fedveil_log.addHandler(handler)
        fedveil_log.setLevel(logging.INFO)
    counters = ServiceCounters(fleet_file=FleetCounterFile(Path(spec.counters_path), create=False))
    fleet_app = fleet_only_app(superlink_app)
    # What Flower's authenticate_node reads as request.app on the memory paths.
    auth_app = fleet_app if keys is None else AuthApp(keys)
    idle = None if index is None else IdlePolls(auth_app, index, counters.fleet_idle_answered)
    gateway = FleetGateway(
        "http://fleet.local",  # nominal: the upstream is in process
        False,
        spec.max_body_bytes,
        counters,
        local=LocalFleet(
            fleet_app, idle, None if heartbeats is None else Heartbeats(auth_app, heartbeats)
        ),
    )
    limits = ConnectionLimits(spec.max_per_listener, spec.max_per_peer, spec.request_timeout_s)
    config = uvicorn.Config(
        gateway,
        lifespan="off",
        log_config=None,  # the SuperLink's logging stays as Flower set it
        log_level="warning",
        access_log=False,
        ssl_certfile=spec.certfile,
        ssl_keyfile=spec.keyfile,
        timeout_graceful_shutdown=2,
        http=guarded_http(limits),
    )
    sock = socket.socket(fileno=spec.fd)
    return follower_server(config), sock


async def serve_with_fleet(
    internal: Any,
    superlink_app: Any,
    spec: FleetListenerSpec,
    index: PendingMessages | None = None,
    heartbeats: HeartbeatBatch | None = None,
    keys: NodeKeys | None = None,
) -> None:
    """Serve the SuperLink (`internal`, which handles the signals) and the Fleet port
    together until the SuperLink's server stops."""
    public, sock = fleet_server(superlink_app, spec, index, heartbeats, keys)
    link = asyncio.create_task(internal.serve())
    # Devices are let in once the SuperLink's own start-up (its lifespan) is done; until
    # then their connections wait in the listening socket's backlog.
    while not internal.started and not link.done():
        await asyncio.sleep(0.05)
    fleet = asyncio.create_task(public.serve(sockets=[sock])) if not link.done() else None
    try:
        await link
    finally:
        public.should_exit = True
        if fleet is not None:
            await fleet


def spec_from_env() -> FleetListenerSpec | None:
    value = os.environ.get(FLEET_ENV)
    return FleetListenerSpec.from_env(value) if value else None
