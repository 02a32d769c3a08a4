"""Flower's SuperLink as a child of `fedveil server`, and the Control API calls we make.

In flwr 1.41/1.42 one HTTP server carries the Control API (start and stop runs,
register SuperNodes), the Runtime API (ServerApps) and the Fleet API
(SuperNodes), and the Control API has no authentication of its own. So the
SuperLink listens on no port at all but on a 0600 Unix socket in the 0700 state
dir (link_socket.py): no other local user can reach it. Only the Fleet routes
are exposed to devices, through fedveil's gateway (gateway.py). Runs reach it as a FAB whose
components name fedveil's installed ServerApp and ClientApp, with the fedveil
run id as its only run config; the SuperLink's SuperExec starts
`flwr-serverapp` for each Flower run (subprocess isolation), which finds the
run directory from FEDVEIL_STATE_DIR in its environment.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from fedveil import __version__
from fedveil.ops.certs import TlsFiles, create_ca, create_server_cert
from fedveil.ops.log_pump import LogPump, RotatingLog
from fedveil.ops.procs import child_env, spawn, stop_group, wait_unix_socket
from fedveil.protocol.deployment import (
    CLIENTAPP_REF,
    CONFIG_KEY,
    FAB_ID,
    RUN_ID_KEY,
    SERVERAPP_REF,
)
from fedveil.server.coordinator.fleet_listener import FLEET_ENV, FleetListenerSpec
from fedveil.server.coordinator.link_socket import (
    SOCKET_ENV,
    client_over_socket,
    socket_path,
)
from fedveil.server.coordinator.settings import ServerSettings
from fedveil.server.coordinator.superexec_shim import TOKEN_DIR_ENV

log = logging.getLogger("fedveil.service")

STATE_ENV = "FEDVEIL_STATE_DIR"


def fab_pyproject() -> str:
    # Runs carry no code: the components are the fedveil installed next to the
    # SuperLink and on each device, so a device never imports what a server sends.
    return f"""[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{FAB_ID.split("/")[1]}"
version = "{__version__}"
description = "fedveil run: the round engine, secure aggregation and DP from the installed fedveil"
license = "Apache-2.0"
dependencies = ["flwr>=1.41,<1.43"]

[tool.flwr.app]
publisher = "{FAB_ID.split("/")[0]}"

[tool.flwr.app.components]
serverapp = "{SERVERAPP_REF}"
clientapp = "{CLIENTAPP_REF}"

[tool.flwr.app.config]
{RUN_ID_KEY} = ""
{CONFIG_KEY} = ""
"""


def build_fab() -> bytes:
    """The FAB every fedveil run is submitted with (deterministic bytes)."""
    from flwr.cli.build import build_fab_from_files

    fab, _ = build_fab_from_files({"pyproject.toml": fab_pyproject().encode()})
    return fab


INTERNAL_HOSTS = ["127.0.0.1", "localhost"]


def internal_tls(state_dir: Path) -> TlsFiles:
    """The SuperLink's own certificate: loopback only, made (and renewed) here.

    Flower needs TLS on the SuperLink for SuperNode authentication, but nothing
    outside this machine talks to it (devices come through the gateway). So it gets
    a private CA for 127.0.0.1 instead of the public certificate, which need not name
    loopback addresses; the CA's key is deleted once it has signed.
    """
    d = state_dir / "tls-internal"
    files = TlsFiles(d / "ca.pem", d / "server.pem", d / "server.key")
    fresh = all(p.exists() for p in (files.ca, files.cert, files.key))
    if fresh:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        left = cert.not_valid_after_utc - dt.datetime.now(dt.timezone.utc)
        fresh = left > dt.timedelta(days=30)
    if not fresh:
        ca_pem, ca_key = create_ca(d, days=365, force=True)
        create_server_cert(d, ca_pem, ca_key, INTERNAL_HOSTS, days=365, force=True)
        ca_key.unlink()
        log.info("made the SuperLink's loopback certificate in %s", d)
    return files


def install_superexec_shim(state_dir: Path) -> Path:
    """state_dir/bin with a `flower-superexec` that runs superexec_shim.py; returns the dir."""
    bindir = state_dir / "bin"
    bindir.mkdir(mode=0o700, exist_ok=True)
    shim = bindir / "flower-superexec"
    shim.write_text(
        f"#!{sys.executable}\nfrom fedveil.server.coordinator.superexec_shim import main\nmain()\n"
    )
    shim.chmod(0o700)
    return bindir


class SuperLinkProcess:
    """`flower-superlink` with its state in state_dir, TLS and SuperNode auth as configured."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.proc: Any = None
        self._log_pump: LogPump | None = None
        # The public Fleet port, served by this process's child (fleet_listener.py); set
        # by `fedveil server` before start. None: the SuperLink serves its socket only.
        self.fleet: FleetListenerSpec | None = None

    def argv(self) -> list[str]:
        s = self.settings
        args = [
            # Nominal: the URLs name it, the socket of FEDVEIL_SUPERLINK_SOCKET carries them.
            "--host",
            "127.0.0.1",
            "--port",
            str(s.superlink_port),
            "--database",
            str(s.state_dir / "superlink.db"),
            "--isolation",
            "subprocess",
            # The ServerApp is fedveil's installed one: nothing to install per run.
            "--disable-runtime-dependency-installation",
        ]
        if s.tls.insecure:
            args.append("--insecure")
        else:
            tls = internal_tls(s.state_dir)
            args += [
                "--ssl-certfile",
                str(tls.cert),
                "--ssl-keyfile",
                str(tls.key),
                "--ssl-ca-certfile",
                str(tls.ca),
            ]
        if s.client_auth:
            args.append("--enable-supernode-auth")
        code = (
            "import sys; sys.argv[0] = 'flower-superlink'; "
            "from fedveil.server.coordinator.link_socket import superlink_main; superlink_main()"
        )
        return [sys.executable, "-c", code, *args]

    @property
    def _pid_file(self) -> Path:
        return self.settings.state_dir / "superlink.pid"

    def _kill_leftovers(self) -> None:
        """SIGKILL what a killed predecessor left behind (its SuperExec, ServerApps).

        The SuperLink dies with `fedveil server`, but Flower's helpers below it only
        notice by polling; they are found by the process group recorded at the last
        start and by carrying this state dir in their environment.
        """
        try:
            pgid = int(self._pid_file.read_text())
        except (FileNotFoundError, ValueError):
            return
        marker = f"{STATE_ENV}={self.settings.state_dir}".encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if os.getpgid(int(proc.name)) != pgid:
                    continue
                if marker not in (proc / "environ").read_bytes().split(b"\0"):
                    continue
                os.kill(int(proc.name), signal.SIGKILL)
                log.warning("killed process %s left by the previous coordinator", proc.name)
            except (OSError, ValueError):
                continue

    def start(self, timeout: float = 60.0) -> None:
        s = self.settings
        os.umask(0o077)  # owner-only files; inherited by the SuperLink, SuperExec and ServerApps
        self._kill_leftovers()
        (s.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        (s.state_dir / "flwr").mkdir(parents=True, exist_ok=True)
        sock = socket_path(s.state_dir)
        shim_dir = install_superexec_shim(s.state_dir)
        env = child_env(
            {
                STATE_ENV: str(s.state_dir),
                SOCKET_ENV: str(sock),
                TOKEN_DIR_ENV: str(s.state_dir / "flwr" / "tokens"),
                "FLWR_HOME": str(s.state_dir / "flwr"),
                # SuperExec looks for new runs every second by default; a run waits less.
                "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
            }
        )
        # Our `flower-superexec` first: ServerApp tokens go in files, not on command lines.
        env["PATH"] = os.pathsep.join([str(shim_dir), env["PATH"]])
        if self.fleet is not None:
            env[FLEET_ENV] = self.fleet.to_env()
        # Its whole output, rotated and with repeats collapsed (fedveil.ops.log_pump):
        # garbage requests and idle polling must not fill the disk.
        self.proc = spawn(
            self.argv(),
            env=env,
            log=subprocess.PIPE,
            cwd=s.state_dir,
            pass_fds=(self.fleet.fd,) if self.fleet is not None else (),
        )
        assert self.proc.stdout is not None
        self._log_pump = LogPump(
            self.proc.stdout, RotatingLog(s.state_dir / "logs" / "superlink.log")
        )
        self._pid_file.write_text(f"{self.proc.pid}\n")  # its process group id, see above
        if not wait_unix_socket(sock, timeout, self.proc):
            code = self.proc.poll()
            self.stop()
            raise RuntimeError(
                f"SuperLink did not start on {sock} within {timeout:.0f} s"
                f" (exit code {code}); see {s.state_dir / 'logs' / 'superlink.log'}"
            )
        log.info("SuperLink up on %s (pid %d)", sock, self.proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=10.0)
        if self._log_pump is not None:
            self._log_pump.join(5.0)  # the pipe ends with the process; the log closes
            self._log_pump = None


@dataclass
class FlowerRun:
    run_id: int
    status: str  # pending | starting | running | finished
    sub_status: str  # completed | failed | stopped | ""
    details: str
    bytes_sent: int
    bytes_recv: int


@dataclass
class NodeView:
    node_id: int
    status: str  # registered | online | offline | unregistered
    name: str


def link_verify(settings: ServerSettings) -> ssl.SSLContext | bool:
    """How our clients check the SuperLink's certificate (False with --insecure: plain HTTP)."""
    if settings.tls.insecure:
        return False
    return ssl.create_default_context(cafile=str(internal_tls(settings.state_dir).ca))


class LinkControl:
    """The Control API calls fedveil needs, over the SuperLink's socket, one lock for the client."""

    def __init__(self, settings: ServerSettings) -> None:
        from flwr.supercore.control.control_http_client import ControlHttpClient

        verify = link_verify(settings)
        self._client = ControlHttpClient(
            f"{settings.scheme}://{settings.superlink_address}", interceptors=[], verify=verify
        )
        # Flower's client takes a host and port only; the socket is the transport.
        self._client._client.close()
        self._client._client = client_over_socket(socket_path(settings.state_dir), verify)
        self._lock = threading.Lock()
        self._fab: bytes | None = None

    def close(self) -> None:
        self._client.close()

    def start_run(self, fedveil_run_id: str, client_config_toml: str) -> int:
        from flwr.common.serde import fab_to_proto, user_config_to_proto
        from flwr.proto.control_pb2 import StartRunRequest
        from flwr.supercore.fab import Fab

        if self._fab is None:
            self._fab = build_fab()
        fab = Fab(hashlib.sha256(self._fab).hexdigest(), self._fab, {})
        req = StartRunRequest(
            fab=fab_to_proto(fab),
            override_config=user_config_to_proto(
                {RUN_ID_KEY: fedveil_run_id, CONFIG_KEY: client_config_toml}
            ),
            federation="",
        )
        with self._lock:
            res = self._client.StartRun(req)
        if not res.HasField("run_id"):
            raise RuntimeError(f"SuperLink refused the run: {res.note or 'no reason given'}")
        return int(res.run_id)

    def runs(self) -> dict[int, FlowerRun]:
        from flwr.proto.control_pb2 import ListRunsRequest

        with self._lock:
            res = self._client.ListRuns(ListRunsRequest())
        out = {}
        for run_id, run in res.run_dict.items():
            out[int(run_id)] = FlowerRun(
                int(run_id),
                run.status.status,
                run.status.sub_status,
                run.status.details,
                int(run.bytes_sent),
                int(run.bytes_recv),
            )
        return out

    def stop_run(self, run_id: int) -> None:
        from flwr.proto.control_pb2 import StopRunRequest

        with self._lock:
            self._client.StopRun(StopRunRequest(run_id=run_id))

    def register_node(self, public_key_pem: bytes, name: str) -> int:
        from flwr.proto.control_pb2 import RegisterNodeRequest

        with self._lock:
            res = self._client.RegisterNode(
                RegisterNodeRequest(public_key=public_key_pem, name=name)
            )
        if not res.node_id:
            raise RuntimeError("SuperLink did not register the key")
        return int(res.node_id)

    def unregister_node(self, node_id: int) -> None:
        from flwr.proto.control_pb2 import UnregisterNodeRequest

        with self._lock:
            self._client.UnregisterNode(UnregisterNodeRequest(node_id=node_id))

    def nodes(self) -> list[NodeView]:
        from flwr.proto.control_pb2 import ListNodesRequest

        with self._lock:
            res = self._client.ListNodes(ListNodesRequest())
        return [NodeView(int(n.node_id), n.status, n.name) for n in res.nodes_info]
