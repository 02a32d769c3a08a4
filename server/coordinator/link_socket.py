"""The SuperLink on a Unix domain socket in the owner-only state dir, not on a TCP port.

flwr 1.42 serves its Control API (start/stop runs, register SuperNode keys, list
nodes), its Runtime API (ServerApps) and its Fleet API on one HTTP server, with
no authentication of its own for the Control API outside Flower's enterprise
OIDC plugin. On a loopback port any local process, of any user, could call it.
So the SuperLink listens on `state_dir/superlink.sock` instead: the state dir
is 0700 and the socket 0600, so the kernel refuses every other user before a
byte is read, and no TCP port of Flower's app exists for anyone to find. Its
clients are all ours: the coordinator's Control API client, and the SuperExec and
ServerApps (through our shim, superexec_shim.py), which reach it by the socket named
in FEDVEIL_SUPERLINK_SOCKET. TLS stays on over the socket. The public Fleet port is
served in the same process, by a second uvicorn server with only fedveil's gateway
and Flower's Fleet routes (fleet_listener.py).

Flower takes only host/port for all of this, so each of our processes patches
the one place that opens the connection: `uvicorn.run` in the SuperLink, and
the httpx client of Flower's protobuf-over-HTTP clients elsewhere. The URLs
keep naming 127.0.0.1:<superlink.port>; only the transport changes.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

import httpx

from fedveil.config import ConfigError

SOCKET_ENV = "FEDVEIL_SUPERLINK_SOCKET"
SOCKET_NAME = "superlink.sock"
# How long the SuperLink keeps an idle connection: above the gateway's pool expiry
# (gateway.UPSTREAM_IDLE_S), so it is always the gateway that lets a connection go, never
# the SuperLink closing one the gateway is about to send on (uvicorn's default is 5 s).
SUPERLINK_KEEP_ALIVE_S = 75
# sun_path is 108 bytes on Linux, with the terminating NUL.
MAX_SOCKET_PATH = 107


def socket_path(state_dir: Path) -> Path:
    """Where the SuperLink listens; refuses a state dir too long for a socket address."""
    path = state_dir.resolve() / SOCKET_NAME
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise ConfigError(
            f"state_dir {state_dir}: the SuperLink's socket {path} is {size} bytes long; "
            f"a Unix socket path may have at most {MAX_SOCKET_PATH}: use a shorter state_dir"
        )
    return path


def bind_socket(path: Path) -> socket.socket:
    """A listening 0600 Unix socket at `path` (a stale one from a killed SuperLink is replaced)."""
    if path.is_socket():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: no window in which it is wider
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(2048)
    return sock


def transport(path: str | Path, verify: ssl.SSLContext | str | bool) -> httpx.HTTPTransport:
    return httpx.HTTPTransport(uds=str(path), verify=verify)


def async_transport(
    path: str | Path, verify: ssl.SSLContext | str | bool
) -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(uds=str(path), verify=verify)


def client_over_socket(path: str | Path, verify: ssl.SSLContext | str | bool) -> httpx.Client:
    """What Flower's ProtobufClient builds (timeout 30 s, redirects), over the socket."""
    return httpx.Client(transport=transport(path, verify), timeout=30.0, follow_redirects=True)


def route_flower_clients(path: str) -> None:
    """Every Flower protobuf-over-HTTP client made in this process talks over the socket."""
    from flwr.supercore.protobuf.client import ProtobufClient

    original = ProtobufClient.__init__
    if getattr(original, "_fedveil_socket", None) == path:
        return

    @functools.wraps(original)
    def init(self: ProtobufClient, base_url: str, **kwargs: Any) -> None:
        original(self, base_url, **kwargs)
        self._client.close()
        self._client = httpx.Client(
            transport=transport(path, kwargs.get("verify", True)),
            timeout=kwargs.get("timeout", 30.0),
            follow_redirects=True,
        )

    init._fedveil_socket = path  # type: ignore[attr-defined]
    ProtobufClient.__init__ = init  # type: ignore[method-assign]


def superlink_main() -> None:
    """`flower-superlink ARGS`, serving on the socket of FEDVEIL_SUPERLINK_SOCKET."""
    import uvicorn

    from fedveil.server.coordinator.fleet_listener import serve_with_fleet, spec_from_env
    from fedveil.server.coordinator.sqlite_busy import wait_for_sqlite_writes

    # Before Flower opens its state: a Fleet request waits for SQLite's write lock
    # rather than failing with a 500 after 5 s (sqlite_busy.py).
    wait_for_sqlite_writes()
    path = Path(os.environ[SOCKET_ENV])
    real_run = uvicorn.run

    def run(app: Any, **kwargs: Any) -> None:
        kwargs.pop("host", None)
        kwargs.pop("port", None)
        sock = bind_socket(path)
        kwargs["timeout_keep_alive"] = SUPERLINK_KEEP_ALIVE_S
        # No log line per Fleet request (a 1,000-device fleet polls ~350 times a second);
        # the gateway counts requests for /metrics, and logs the refused ones.
        kwargs["access_log"] = False
        spec = spec_from_env()
        if spec is None:
            real_run(app, fd=sock.fileno(), **kwargs)
            return
        # The public Fleet port too, in this process (fleet_listener.py).
        from uvicorn._compat import asyncio_run

        from fedveil.server.coordinator.heartbeats import batched_heartbeats
        from fedveil.server.coordinator.idle_polls import watched_index
        from fedveil.server.coordinator.node_keys import watched_keys
        from fedveil.server.coordinator.process_profile import profiled

        # Listening to the state's writes before any request can make one (idle_polls.py).
        index = watched_index(app)
        config = uvicorn.Config(app, fd=sock.fileno(), **kwargs)
        server = uvicorn.Server(config)
        with profiled(spec.profile_path):  # the flusher thread is profiled too
            # Heartbeats written in batches, flushed before any read of a node's liveness.
            heartbeats = batched_heartbeats(app)
            # Keys' node ids in memory for those paths, forgotten on any write to a node.
            keys = watched_keys(app)
            try:
                asyncio_run(
                    serve_with_fleet(server, app, spec, index, heartbeats, keys),
                    loop_factory=config.get_loop_factory(),
                )
            finally:
                if heartbeats is not None:
                    heartbeats.close()  # what the last interval noted, written before exit
        if not server.started:
            sys.exit(3)  # as uvicorn.run does when start-up failed

    uvicorn.run = run  # flwr's flower_superlink calls `uvicorn.run(...)` at this point

    from flwr.superlink.cli import flower_superlink

    sys.argv[0] = "flower-superlink"
    sys.exit(flower_superlink())


def serverapp_main() -> None:
    """`flwr-serverapp ARGS`, reaching the Runtime API over the socket."""
    route_flower_clients(os.environ[SOCKET_ENV])
    from flwr.superlink.cli import flwr_serverapp

    sys.argv[0] = "flwr-serverapp"
    sys.exit(flwr_serverapp())
