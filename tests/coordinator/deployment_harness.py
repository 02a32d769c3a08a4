"""A real deployment on loopback for the service tests: `fedveil server` and `fedveil client`
processes, TLS and SuperNode authentication on, every process cleaned up by the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from loopback_ports import free_port

from fedveil.ops.certs import create_client_key, create_test_deployment

COORDINATOR_TESTS = Path(__file__).resolve().parent
TESTS = COORDINATOR_TESTS.parent
TOKEN = "test-admin-token-0123456789abcdef"


def test_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(COORDINATOR_TESTS), str(TESTS), env.get("PYTHONPATH", "")]
    )
    env["FLWR_TELEMETRY_ENABLED"] = "0"
    env.pop("FEDVEIL_ADMIN_TOKEN", None)
    env.update(extra or {})
    return env


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError, KeyError, ValueError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_exc})"
    )


class Deployment:
    def __init__(self, root: Path, *, clients: int = 0, extra_server_toml: str = "") -> None:
        self.root = root
        self.certs = root / "certs"
        self.files = create_test_deployment(self.certs, ["127.0.0.1", "localhost"], clients)
        self.state = root / "state"
        self.api_port, self.fleet_port, self.link_port = free_port(), free_port(), free_port()
        (root / "admin.token").write_text(TOKEN + "\n")
        os.chmod(root / "admin.token", 0o600)
        self.config = root / "server.toml"
        self.config.write_text(
            f"""state_dir = "state"
[api]
port = {self.api_port}
max_body_bytes = 65536
[fleet]
port = {self.fleet_port}
max_body_bytes = 8388608
[superlink]
port = {self.link_port}
[tls]
cert = "certs/server.pem"
key = "certs/server.key"
ca = "certs/ca.pem"
[auth]
admin_token_file = "admin.token"
[runs]
allowed_tasks = ["deploy_task:make", "tiny_task:make"]
{extra_server_toml}"""
        )
        self.server: subprocess.Popen[bytes] | None = None
        self.clients: dict[int, subprocess.Popen[bytes]] = {}
        # client id -> its private key, while the enrolled key is not the deployment's own
        self.keys: dict[int, Path] = {}
        self.http = self._api_client()
        self.admin = {"Authorization": f"Bearer {TOKEN}"}
        self._logs: list[Any] = []

    def _api_client(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"https://127.0.0.1:{self.api_port}",
            verify=str(self.certs / "ca.pem"),
            timeout=30,
        )

    @property
    def fleet(self) -> str:
        return f"127.0.0.1:{self.fleet_port}"

    def _log(self, name: str) -> Any:
        f = (self.root / f"{name}.log").open("ab")
        self._logs.append(f)
        return f

    # -- processes ------------------------------------------------------------
    def start_server(self, timeout: float = 90.0) -> None:
        self.server = subprocess.Popen(
            [sys.executable, "-m", "fedveil.cli.main", "server", "--config", str(self.config)],
            env=test_env(),
            cwd=self.root,
            stdout=self._log("server"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self.ready, timeout, "the coordinator to be ready")

    def ready(self) -> bool:
        if self.server is not None and self.server.poll() is not None:
            raise AssertionError(
                f"fedveil server exited with {self.server.returncode}; see {self.root}/server.log"
            )
        return self.http.get("/readyz").status_code == 200

    def enroll(self, cid: int) -> None:
        pub = self.certs / "clients" / f"client-{cid}.pub"
        if not pub.exists():
            create_client_key(self.certs / "clients", f"client-{cid}")
        r = self.http.post(
            "/clients", json={"client_id": cid, "public_key": pub.read_text()}, headers=self.admin
        )
        assert r.status_code == 201, r.text

    def key(self, cid: int) -> Path:
        """The private key client `cid` is enrolled with."""
        return self.keys.get(cid, self.certs / "clients" / f"client-{cid}.key")

    def reenroll(self, cid: int, name: str) -> None:
        """Revoke client `cid`'s key and enroll a new one (`client-CID-NAME`), as an operator
        does for a replaced device. A SIGKILLed SuperNode's node stays online at the
        SuperLink for up to 2 x 30 s (Flower's heartbeat patience) and a SuperNode with the
        same key cannot activate it until then: a new key is a new node, online at once."""
        r = self.http.delete(f"/clients/{cid}", headers=self.admin)
        assert r.status_code == 200, r.text
        key, pub = create_client_key(self.certs / "clients", f"client-{cid}-{name}")
        r = self.http.post(
            "/clients", json={"client_id": cid, "public_key": pub.read_text()}, headers=self.admin
        )
        assert r.status_code == 201, r.text
        self.keys[cid] = key

    def start_client(
        self, cid: int, *args: str, script: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        key = self.key(cid)
        base = script or [
            sys.executable,
            "-m",
            "fedveil.cli.main",
            "client",
            "--server",
            self.fleet,
            "--client-id",
            str(cid),
            "--ca",
            str(self.certs / "ca.pem"),
            "--key",
            str(key),
            "--state-dir",
            str(self.root / f"client-{cid}"),
        ]
        proc = subprocess.Popen(
            [*base, *args],
            env=test_env(),
            cwd=self.root,
            stdout=self._log(f"client-{cid}"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.clients[cid] = proc
        return proc

    def device_script(self, cid: int, script: str) -> list[str]:
        """argv of a device script in tests/coordinator, called as
        `script SERVER CLIENT_ID STATE_DIR CA KEY` (garbage_client.py, late_reply_client.py)."""
        return [
            sys.executable,
            str(COORDINATOR_TESTS / script),
            self.fleet,
            str(cid),
            str(self.root / f"client-{cid}"),
            str(self.certs / "ca.pem"),
            str(self.key(cid)),
        ]

    def kill_client(self, cid: int) -> None:
        proc = self.clients.pop(cid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`fedveil ARGS` as an operator runs it against this coordinator."""
        env = test_env(
            {
                "FEDVEIL_API": f"https://127.0.0.1:{self.api_port}",
                "FEDVEIL_CA": str(self.certs / "ca.pem"),
                "FEDVEIL_ADMIN_TOKEN_FILE": str(self.root / "admin.token"),
            }
        )
        return subprocess.run(
            [sys.executable, "-m", "fedveil.cli.main", *args],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def connected(self) -> int:
        for cid, proc in self.clients.items():  # fail fast instead of waiting for a dead client
            if proc.poll() is not None:
                log = (self.root / f"client-{cid}.log").read_text()[-2000:]
                raise AssertionError(f"client {cid} exited with {proc.returncode}:\n{log}")
        return int(self.http.get("/cluster").json()["clients_connected"] or 0)

    # -- runs -------------------------------------------------------------------
    def submit(self, toml: str) -> str:
        r = self.http.post(
            "/runs", content=toml, headers={**self.admin, "Content-Type": "application/toml"}
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def run(self, rid: str) -> dict[str, Any]:
        r = self.http.get(f"/runs/{rid}")
        r.raise_for_status()
        return r.json()

    def wait_status(self, rid: str, status: str, timeout: float) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            run = self.run(rid)
            if run["status"] in ("failed", "stopped") and status != run["status"]:
                raise AssertionError(f"run {rid} {run['status']}: {run.get('error')}")
            return run if run["status"] == status else None

        try:
            return wait_for(check, timeout, f"run {rid} to be {status}")
        except AssertionError as exc:
            if status not in ("failed", "stopped"):
                # A run left going would hold the coordinator's run slot and time out
                # every later test of the module too: one failure, one report.
                with contextlib.suppress(httpx.HTTPError):
                    self.http.post(f"/runs/{rid}/stop", headers=self.admin)
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def diagnostics(self, tail: int = 1500) -> str:
        """The end of the coordinator's, the newest runs' and every device's logs, for a failure."""
        runs = sorted(self.state.glob("runs/*/server.log"))[-2:]  # the newest two
        paths = [self.root / "server.log", *runs]
        for cid in sorted(self.clients):
            paths += [
                self.root / f"client-{cid}.log",
                self.root / f"client-{cid}" / "supernode.log",
            ]
        parts = []
        for path in paths:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")[-tail:]
                parts.append(f"--- {path.relative_to(self.root)} (end) ---\n{text}")
        return "\n".join(parts)

    def wait_rounds(self, rid: str, rounds: int, timeout: float) -> dict[str, Any]:
        return wait_for(
            lambda: (r := self.run(rid))["rounds_completed"] >= rounds and r,
            timeout,
            f"{rounds} rounds of {rid}",
        )

    def rounds(self, rid: str) -> list[dict[str, Any]]:
        return self.http.get(f"/runs/{rid}/rounds").json()

    # -- teardown ------------------------------------------------------------------
    def stop_server(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        if self.server is None:
            return
        # The harness's own keep-alive connection would hold the coordinator's graceful
        # shutdown until uvicorn gives up on it (timeout_graceful_shutdown, 2 s): a fresh
        # client, with no connection open, for whatever the test asks next.
        self.http.close()
        self.http = self._api_client()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.server.pid, sig)
        try:
            self.server.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(10)
        self.server = None

    def close(self) -> None:
        procs = list(self.clients.values())
        self.clients.clear()
        for proc in procs:  # all at once: each takes seconds to leave the federation
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.stop_server()
        kill_marked(self.state)
        self.http.close()
        for f in self._logs:
            f.close()


def kill_marked(state: Path) -> list[int]:
    """SIGKILL any process still carrying this deployment's state dir (the last resort)."""
    marker = f"FEDVEIL_STATE_DIR={state}".encode()
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return killed


def run_toml(
    *,
    rounds: int,
    clients: int,
    per_round: int,
    seed: int,
    name: str,
    extra: str = "",
    tables: str = "",
) -> str:
    return f"""seed = {seed}
[model]
name = "mlp"
task = "deploy_task:make"
[data]
num_clients = {clients}
[client]
local_epochs = 1
batch_size = 16
lr = 0.1
momentum = 0.5
[server]
rounds = {rounds}
per_round = {per_round}
optimizer = "fedavgm"
server_lr = 1.0
{extra}
{tables}
[deploy]
name = "{name}"
wait_for_clients = {per_round}
wait_timeout_s = 180
"""
