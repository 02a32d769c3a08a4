"""`fedveil server`: everything the coordinator needs, started with one command.

This process serves the HTTP API and dashboard (api.port, TLS) with one uvicorn
server. It binds the Fleet port (fleet.port) too, but its child serves it: Flower's
SuperLink, on an owner-only Unix socket (state_dir/superlink.sock, link_socket.py;
state in state_dir/superlink.db), runs the Fleet gateway and Flower's Fleet routes in
its own process on the inherited listening socket (fleet_listener.py), with TLS and
the same connection limits. Its SuperExec starts one `flwr-serverapp` process per
Flower run. A supervisor thread follows runs (runs.py) and restarts the SuperLink if
it dies; devices' connections wait in the Fleet port's backlog meanwhile.

SIGTERM/SIGINT: stop accepting requests, stop the SuperLink (and with it any
ServerApp), exit 0. Active runs stay active on disk and resume from their last
checkpoint at the next start — after SIGKILL too, since the SuperLink child
dies with this process (procs.py) and every round is checkpointed atomically.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from fedveil.ops.listening import listening_socket
from fedveil.server.coordinator.api import create_api
from fedveil.server.coordinator.fleet_counters import FILE_NAME as FLEET_COUNTERS_FILE
from fedveil.server.coordinator.fleet_counters import FleetCounterFile
from fedveil.server.coordinator.fleet_listener import PROFILE_ENV, FleetListenerSpec
from fedveil.server.coordinator.service import Service
from fedveil.server.coordinator.settings import ServerSettings, is_loopback

log = logging.getLogger("fedveil.service")


class PortDispatch:
    """One ASGI app per listening port (scope['server'] is the local address)."""

    def __init__(self, apps: dict[int, Any], service: Service) -> None:
        self.apps, self.service = apps, service

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        port = (scope.get("server") or (None, None))[1]
        app = self.apps.get(port)
        if app is None:  # pragma: no cover - only our two sockets exist
            return
        await app(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    # Blocking on purpose: nothing is served until the SuperLink is up,
                    # and the SuperLink must be started from the main thread (procs.py).
                    self.service.start()
                except Exception as exc:
                    log.error("start-up failed: %s", exc)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.service.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def serve(settings: ServerSettings) -> int:
    """Run the coordinator until SIGTERM/SIGINT; returns the exit code."""
    import uvicorn

    from fedveil.server.serving.connections import ConnectionLimits, guarded_http

    s = settings
    if s.tls.insecure:
        log.warning(
            "--insecure: the Fleet API and the HTTP API run WITHOUT TLS, SuperNode "
            "authentication is OFF and the admin token travels in the clear; for tests on "
            "a trusted network only"
        )
        for name, listen in (("api", s.api), ("fleet", s.fleet)):
            if not is_loopback(listen.host):
                log.warning(
                    "--insecure and %s.host = %s: reachable from the network", name, listen.host
                )
    elif not s.client_auth:
        log.warning(
            "auth.client_auth = false: any SuperNode that reaches the Fleet API may join runs"
        )
    service = Service(s)
    log.info("admin token from %s", service.token.source)
    fleet_sock = listening_socket(s.fleet.host, s.fleet.port)
    fleet_port = fleet_sock.getsockname()[1]
    counters_path = s.state_dir / FLEET_COUNTERS_FILE
    service.counters.fleet_file = FleetCounterFile(counters_path, create=True)
    service.superlink.fleet = FleetListenerSpec(
        fd=fleet_sock.fileno(),
        certfile=None if s.tls.insecure else str(s.tls.cert),
        keyfile=None if s.tls.insecure else str(s.tls.key),
        max_body_bytes=s.fleet.max_body_bytes,
        max_per_listener=s.connections.max_per_listener,
        max_per_peer=s.connections.max_per_peer,
        request_timeout_s=s.connections.request_timeout_s,
        counters_path=str(counters_path),
        profile_path=os.environ.get(PROFILE_ENV) or None,
    )
    sockets = [listening_socket(s.api.host, s.api.port)]
    api_port = sockets[0].getsockname()[1]
    dispatch = PortDispatch({api_port: create_api(service)}, service)
    from fedveil.server.coordinator.api import BodyLimit

    dispatch.apps[api_port] = BodyLimit(
        dispatch.apps[api_port], s.api.max_body_bytes, service.counters
    )
    if s.serving.enabled:  # [serving]: promoted versions' prediction API, on its own port
        from fedveil.server.coordinator.model_versions import REGISTRY_DIR
        from fedveil.server.serving.promoted import promoted_app

        sockets.append(listening_socket(s.serving.host, s.serving.port))
        port = sockets[-1].getsockname()[1]
        base = s.source.parent if s.source is not None else Path.cwd()
        # A promoted custom-task version loads only a task the operator allowed to run.
        dispatch.apps[port] = promoted_app(
            s.serving, s.state_dir / REGISTRY_DIR, base, allowed_tasks=s.allowed_tasks
        )
        log.warning(
            "fedveil coordinator: prediction API on %s://%s:%d", s.scheme, s.serving.host, port
        )
    config = uvicorn.Config(
        dispatch,
        lifespan="on",
        log_level="warning",
        access_log=False,
        ssl_certfile=None if s.tls.insecure else str(s.tls.cert),
        ssl_keyfile=None if s.tls.insecure else str(s.tls.key),
        # SuperNodes keep their connections open; do not wait long for them to close.
        timeout_graceful_shutdown=2,
        # [connections]: per listener and per peer, and a deadline on each request.
        http=guarded_http(
            ConnectionLimits(
                s.connections.max_per_listener,
                s.connections.max_per_peer,
                s.connections.request_timeout_s,
            )
        ),
    )
    server = uvicorn.Server(config)
    log.warning(
        "fedveil coordinator: API and dashboard on %s://%s:%d, Fleet API on %s:%d, state in %s",
        s.scheme,
        s.api.host,
        api_port,
        s.fleet.host,
        fleet_port,
        s.state_dir,
    )
    # uvicorn re-raises the stop signal once it has shut down, to the handler that was
    # installed before it: make that a no-op, so a requested stop exits with status 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run(sockets=sockets)
    finally:
        for sock in [*sockets, fleet_sock]:
            sock.close()
    return 0 if server.started else 1
