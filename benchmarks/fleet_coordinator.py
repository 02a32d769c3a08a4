"""A real `fedveil server` on loopback for the Fleet load benchmark (its /proc readings:
procstats.py).

The coordinator runs as an operator starts it (`fedveil server --config server.toml`):
TLS on the API and the Fleet gateway, SuperNode authentication on, Flower's SuperLink
as its child. The benchmark enrolls its emulated devices through the admin API, as
`fedveil clients add` does.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fedveil.benchmarks.procstats import TreeSample, sample_tree
from fedveil.ops.certs import create_test_deployment
from fedveil.server.coordinator.fleet_listener import PROFILE_ENV

# The line `fedveil server` logs once it listens (server/coordinator/launch.py), with the
# ports it bound.
READY_LINE = re.compile(
    r"API and dashboard on https?://\S+:(?P<api>\d+), Fleet API on \S+:(?P<fleet>\d+),"
)


class Coordinator:
    """`fedveil server` in `root`, with a fresh CA, server certificate and admin token."""

    def __init__(self, root: Path, *, profile: Path | None = None) -> None:
        self.root = root
        self.certs = root / "certs"
        create_test_deployment(self.certs, ["127.0.0.1", "localhost"], 0)
        # Port 0: the coordinator binds free ports itself and names them in its ready line
        # (start() reads them): no port picked here that another process could take first.
        self.api_port = self.fleet_port = 0
        self.token = secrets.token_hex(16)
        token_file = root / "admin.token"
        token_file.write_text(self.token + "\n")
        token_file.chmod(0o600)
        self.config = root / "server.toml"
        self.config.write_text(
            """state_dir = "state"
[api]
port = 0
[fleet]
port = 0
[tls]
cert = "certs/server.pem"
key = "certs/server.key"
ca = "certs/ca.pem"
[auth]
admin_token_file = "admin.token"
[connections]
# Every emulated device comes from 127.0.0.1 (one peer): as many as the listener takes.
max_per_peer = 512
"""
        )
        self.profile = profile
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(  # its base_url set once the coordinator names its port
            verify=str(self.certs / "ca.pem"),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
        )

    @property
    def superlink_profile(self) -> Path | None:
        """Where the SuperLink child's cProfile goes (with `profile`): next to it."""
        if self.profile is None:
            return None
        return self.profile.with_name(f"{self.profile.stem}-superlink.pstats")

    @property
    def fleet_address(self) -> str:
        return f"127.0.0.1:{self.fleet_port}"

    @property
    def ca(self) -> Path:
        return self.certs / "ca.pem"

    def start(self, timeout: float = 120.0) -> None:
        cmd = [sys.executable]
        if self.profile is not None:  # the coordinator process itself under cProfile
            cmd += ["-m", "cProfile", "-o", str(self.profile)]
        cmd += ["-m", "fedveil.cli.main", "server", "--config", str(self.config)]
        env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0")
        env.pop("FEDVEIL_ADMIN_TOKEN", None)
        if self.profile is not None:  # and its SuperLink child, which serves the Fleet port
            env[PROFILE_ENV] = str(self.superlink_profile)
        log = self.root / "server.log"
        seen = log.stat().st_size if log.exists() else 0  # a restart: only its own lines
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.root,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"fedveil server exited with {self.proc.returncode}; see {self.root}/server.log"
                )
            if not self.api_port:
                with log.open("rb") as f:
                    f.seek(seen)
                    ready = READY_LINE.search(f.read().decode(errors="replace"))
                if ready is not None:
                    self.api_port, self.fleet_port = int(ready["api"]), int(ready["fleet"])
                    self.http.base_url = httpx.URL(f"https://127.0.0.1:{self.api_port}")
            if self.api_port:
                with contextlib.suppress(httpx.HTTPError):
                    if self.http.get("/readyz").status_code == 200:
                        return
            time.sleep(0.5)
        raise RuntimeError(f"fedveil server not ready within {timeout:.0f} s")

    def enroll(self, client_id: int, openssh_public_key: str) -> None:
        r = self.http.post(
            "/clients", json={"client_id": client_id, "public_key": openssh_public_key}
        )
        if r.status_code != 201:
            raise RuntimeError(f"enrolling client {client_id}: {r.status_code} {r.text}")

    def connected(self) -> int:
        """Enrolled clients the SuperLink lists online (GET /cluster)."""
        return int(self.http.get("/cluster").json()["clients_connected"] or 0)

    def gateway_warnings(self) -> list[str]:
        """The gateway's warnings so far (e.g. 'SuperLink unreachable'), newest last: from
        server.log and, since the gateway runs in the SuperLink's process, its log."""
        lines: list[str] = []
        for log in (self.root / "server.log", self.root / "state" / "logs" / "superlink.log"):
            text = log.read_text(errors="replace") if log.exists() else ""
            lines += [line for line in text.splitlines() if "fedveil.gateway" in line]
        return lines[-20:]

    def sample(self) -> TreeSample:
        assert self.proc is not None
        return sample_tree(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT first: under cProfile that writes the profile, then the server exits.
            os.kill(self.proc.pid, signal.SIGINT if self.profile else signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
        self.http.close()
