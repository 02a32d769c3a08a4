"""Held connections against the coordinator: one peer opens more TLS connections than its
share on the API and Fleet ports and sends partial headers. Past [connections]
max_per_peer they are closed at once, the rest at request_timeout_s; meanwhile the admin
API answers and an enrolled device connects and is counted online."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest
from deploy_task import write_client_file
from deployment_harness import Deployment, wait_for

pytestmark = pytest.mark.procs  # starts processes (make test-fast leaves it out)

PER_PEER, TIMEOUT, HELD = 8, 4.0, 24
LATE_S = 20.0  # how late past the deadline a loaded machine may cut


def hold(dep: Deployment, port: int) -> list[ssl.SSLSocket]:
    """HELD TLS connections from 127.0.0.2, each with a request's first header bytes."""
    ctx = ssl.create_default_context(cafile=str(dep.certs / "ca.pem"))
    out = []
    for _ in range(HELD):
        raw = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
        try:
            s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            s.sendall(b"POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x\r\nContent-Le")
        except OSError:  # cut during the handshake: counted as cut below
            raw.close()
            continue
        out.append(s)
    return out


def still_open(s: ssl.SSLSocket) -> bool:
    s.settimeout(0.01)
    try:
        return s.recv(1) != b""
    except TimeoutError:
        return True
    except (OSError, ssl.SSLError):
        return False


def test_held_connections_leave_the_coordinator_serving(tmp_path: Path) -> None:
    connections = f"[connections]\nmax_per_peer = {PER_PEER}\nrequest_timeout_s = {TIMEOUT}\n"
    dep = Deployment(tmp_path, clients=1, extra_server_toml=connections)
    try:
        dep.start_server()
        held = hold(dep, dep.api_port) + hold(dep, dep.fleet_port)
        started = time.monotonic()
        # Past the share, cut at once: well before the request deadline would cut them
        # (polled rather than slept on, for a coordinator slowed by a loaded machine).
        wait_for(
            lambda: sum(still_open(s) for s in held) <= 2 * PER_PEER,
            TIMEOUT - 1.0,
            f"the connections past {PER_PEER} per peer to be cut",
            interval=0.1,
        )
        # The admin API and an enrolled device are served meanwhile.
        assert dep.http.get("/clients", headers=dep.admin).status_code == 200
        dep.enroll(0)
        dep.start_client(0, "--data", str(write_client_file(tmp_path / "data", 1, 0, "npz")))
        wait_for(lambda: dep.connected() >= 1, 90, "the enrolled device to connect")
        # Whatever it still holds is cut at the deadline (without one: never). A loaded
        # machine may cut them seconds late; the wait ends as soon as they are.
        wait_for(
            lambda: sum(still_open(s) for s in held) == 0,
            max(1.0, TIMEOUT + LATE_S - (time.monotonic() - started)),
            "the held connections to be cut at the request deadline",
            interval=0.2,
        )
        assert dep.http.get("/readyz").status_code == 200
        assert "connection from 127.0.0.2" in (tmp_path / "server.log").read_text()
    finally:
        dep.close()
