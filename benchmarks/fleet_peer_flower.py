"""Stock Flower's SuperLink on loopback: the peer of `fedveil bench fleet --peer flower`.

`flower-superlink` exactly as Flower ships it and documents a secure deployment: TLS on
its one HTTP port (Fleet, Control and Runtime APIs), SuperNode authentication on
(`--enable-supernode-auth`), a SQLite state file (`--database`), its default
`subprocess` isolation (it starts its SuperExec), its default logging (uvicorn's access
log included) written to a file. Nothing of fedveil sits in front of it or inside it.
The emulated devices' keys are registered through its Control API, as `flwr supernode
register` does; /proc is read as for fedveil's coordinator (fleet_coordinator.py), so
both report the same figures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import flwr
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedveil.benchmarks.procstats import TreeSample, sample_tree
from fedveil.ops.certs import create_test_deployment
from fedveil.ops.procs import free_port

PEER_NAME = f"flower-superlink {flwr.__version__}"


PORT_TRIES = 5


class StockSuperLink:
    """`flower-superlink` in `root`, with its own CA and server certificate.

    The same interface as fleet_coordinator.Coordinator (start, enroll, connected,
    sample, gateway_warnings, stop, fleet_address, ca), so bench_fleet drives both alike.
    """

    name = PEER_NAME

    def __init__(self, root: Path, *, profile: Path | None = None) -> None:
        self.root = root
        self.profile = profile
        self.certs = root / "certs"
        create_test_deployment(self.certs, ["127.0.0.1", "localhost"], 0)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._control: Any = None

    @property
    def fleet_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.certs / "ca.pem"

    def argv(self) -> list[str]:
        exe = [str(Path(sys.executable).with_name("flower-superlink"))]
        if self.profile is not None:  # the SuperLink itself under cProfile (Flower's script)
            exe = [sys.executable, "-m", "cProfile", "-o", str(self.profile), *exe]
        return [
            *exe,
            "--ssl-certfile",
            str(self.certs / "server.pem"),
            "--ssl-keyfile",
            str(self.certs / "server.key"),
            "--ssl-ca-certfile",
            str(self.ca),
            "--enable-supernode-auth",
            "--database",
            str(self.root / "state.db"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def _client(self) -> Any:  # Flower's ControlHttpClient, imported late
        from flwr.supercore.control.control_http_client import ControlHttpClient

        if self._control is None:
            verify = ssl.create_default_context(cafile=str(self.ca))
            self._control = ControlHttpClient(
                f"https://{self.fleet_address}", interceptors=[], verify=verify
            )
        return self._control

    def start(self, timeout: float = 120.0) -> None:
        from flwr.proto.control_pb2 import ListNodesRequest

        env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_HOME=str(self.root / "flwr"))
        # The SuperLink starts `flower-superexec` from PATH: the one next to it.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        deadline = time.monotonic() + timeout
        # Flower's SuperLink takes its port on the command line (no port 0): one that
        # another process took after its pick makes it exit at once; then a fresh one.
        tried: list[int] = []
        for _ in range(PORT_TRIES):
            self.proc = subprocess.Popen(
                self.argv(),
                cwd=self.root,
                env=env,
                stdout=(self.root / "superlink.log").open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:  # over TLS with this CA: only this SuperLink answers
                    self._client().ListNodes(ListNodesRequest())
                    return
                except Exception:  # not listening yet: any transport error
                    time.sleep(0.5)
            if self.proc.poll() is None:
                raise RuntimeError(f"flower-superlink not ready within {timeout:.0f} s")
            tried.append(self.port)
            self.port, self._control = free_port(), None
        raise RuntimeError(
            f"flower-superlink exited before it was ready on ports {tried} (last exit "
            f"{self.proc.returncode}); see {self.root}/superlink.log"
        )

    def enroll(self, client_id: int, openssh_public_key: str) -> None:
        from flwr.proto.control_pb2 import RegisterNodeRequest
        from flwr.supercore.primitives.asymmetric import public_key_to_bytes

        key = serialization.load_ssh_public_key(openssh_public_key.encode())
        assert isinstance(key, ec.EllipticCurvePublicKey)
        res = self._client().RegisterNode(
            RegisterNodeRequest(public_key=public_key_to_bytes(key), name=f"device-{client_id}")
        )
        if not res.node_id:
            raise RuntimeError(f"flower-superlink did not register device {client_id}")

    def connected(self) -> int:
        """Registered nodes the SuperLink lists online (ListNodes, as `flwr supernode ls`)."""
        from flwr.proto.control_pb2 import ListNodesRequest

        res = self._client().ListNodes(ListNodesRequest())
        return sum(1 for n in res.nodes_info if n.status == "online")

    def gateway_warnings(self) -> list[str]:
        """Its WARNING/ERROR log lines so far, newest last (there is no gateway)."""
        log = self.root / "superlink.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return [ln for ln in text.splitlines() if "WARNING" in ln or "ERROR" in ln][-20:]

    def sample(self) -> TreeSample:
        assert self.proc is not None
        s = sample_tree(self.proc.pid)
        # No gateway: the whole tree is the SuperLink (and its SuperExec).
        return TreeSample(s.cpu_s, s.rss_mb, 0.0)

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT to the SuperLink alone under cProfile: it exits, the profile is
            # written; otherwise SIGTERM to its group (it and its SuperExec).
            if self.profile is not None:
                os.kill(self.proc.pid, signal.SIGINT)
            else:
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):  # its SuperExec, if still there
                os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc = None
