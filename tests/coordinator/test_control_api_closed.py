"""Issue 18: the SuperLink's Control API is closed to local processes.

The attacker runs on the coordinator's machine without the admin token. With
Flower's own Control API client it tries to list runs and nodes, stop the live
run and register a node key, on every TCP port the coordinator's process tree
listens on, on the SuperLink's configured port, and (as another user) on the
SuperLink's Unix socket. Every attempt must be refused and change nothing, while
the coordinator's own operations (start a run, enroll a client with `fedveil
clients enroll`, stop the run with the admin token) still work.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from deployment_harness import Deployment, run_toml, wait_for
from flwr.proto.control_pb2 import (
    ListNodesRequest,
    ListRunsRequest,
    RegisterNodeRequest,
    StopRunRequest,
)
from flwr.supercore.control.control_http_client import ControlHttpClient
from proctree import descendants, listening_tcp_ports, listening_unix_paths

from fedveil.ops.certs import create_client_key
from fedveil.server.coordinator.link_socket import SOCKET_NAME
from fedveil.server.coordinator.settings import load_settings
from fedveil.server.coordinator.superlink import LinkControl

NOBODY = 65534


class StatusRecorder:
    """A Flower client interceptor that keeps the HTTP status of each answer."""

    def __init__(self) -> None:
        self.status: int | None = None

    def intercept(self, context: Any, call_next: Callable[[Any], httpx.Response]) -> Any:
        response = call_next(context)
        self.status = response.status_code
        return response


def attack(client: ControlHttpClient, recorder: StatusRecorder, flower_run: int) -> dict[str, str]:
    """Each Control API call, and what became of it: 'accepted' or why it was refused."""
    key = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    calls: dict[str, Callable[[], Any]] = {
        "ListRuns": lambda: client.ListRuns(ListRunsRequest()),
        "ListNodes": lambda: client.ListNodes(ListNodesRequest()),
        "StopRun": lambda: client.StopRun(StopRunRequest(run_id=flower_run)),
        "RegisterNode": lambda: client.RegisterNode(
            RegisterNodeRequest(public_key=pem, name="intruder")
        ),
    }
    out = {}
    for name, call in calls.items():
        recorder.status = None
        try:
            call()
            out[name] = "accepted"
        except httpx.HTTPStatusError as exc:
            out[name] = f"HTTP {exc.response.status_code}"
        except httpx.TransportError as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
        except ValueError:  # a 2xx answer that is not Flower's: still an answer
            out[name] = f"accepted? HTTP {recorder.status}"
    return out


def tcp_client(port: int, scheme: str) -> tuple[ControlHttpClient, StatusRecorder]:
    recorder = StatusRecorder()
    return ControlHttpClient(
        f"{scheme}://127.0.0.1:{port}", interceptors=[recorder], verify=False, timeout=10
    ), recorder


def attack_socket_as_nobody(path: Path, flower_run: int) -> dict[str, str]:
    """The same calls over the SuperLink's socket from a process of another user."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out: dict[str, str] = {}
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(str(path))
                    out["connect"] = "accepted"
                except OSError as exc:
                    out["connect"] = f"{type(exc).__name__}: {exc.strerror}"
            client, recorder = tcp_client(1, "https")
            client._client = httpx.Client(
                transport=httpx.HTTPTransport(uds=str(path), verify=False), timeout=10
            )
            out |= attack(client, recorder, flower_run)
            os.write(write, json.dumps(out).encode())
        except BaseException as exc:
            os.write(write, json.dumps({"child": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@contextlib.contextmanager
def open_root() -> Iterator[Path]:
    """A deployment folder other users may enter, so that only the state dir's and the
    socket's own modes stand between them and the SuperLink (pytest's tmp_path is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="fv-ctl-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.procs
def test_a_local_process_without_the_admin_token_cannot_reach_the_control_api():
    with open_root() as root:
        dep = Deployment(root)
        try:
            _play_the_local_attacker(dep)
        finally:
            dep.close()


def _play_the_local_attacker(dep: Deployment) -> None:
    dep.start_server()
    assert dep.server is not None
    owner = LinkControl(load_settings(dep.config))  # what the coordinator itself holds
    try:
        # The coordinator's own operations: a run (waiting for 2 devices) and an enrolment.
        rid = dep.submit(run_toml(rounds=1, clients=2, per_round=2, seed=1, name="ctl"))
        flower_run = wait_for(
            lambda: next((r.run_id for r in owner.runs().values() if r.status == "running"), 0),
            60,
            "the Flower run to be running",
        )
        create_client_key(dep.certs / "clients", "client-0")
        enrolled = dep.cli(
            "clients", "enroll", str(dep.certs / "clients" / "client-0.pub"), "--id", "0"
        )
        assert enrolled.returncode == 0, enrolled.stderr
        nodes_before = {n.node_id for n in owner.nodes()}
        assert len(nodes_before) == 1

        # Every TCP port the coordinator's tree listens on, and the SuperLink's own.
        tree = [dep.server.pid, *descendants(dep.server.pid)]
        ports = listening_tcp_ports(tree)
        assert ports == {dep.api_port, dep.fleet_port}, ports  # the SuperLink has none
        results = {}
        for port in sorted(ports | {dep.link_port}):
            for scheme in ("https", "http"):
                client, recorder = tcp_client(port, scheme)
                with client:
                    results[f"{scheme}://127.0.0.1:{port}"] = attack(client, recorder, flower_run)

        # The SuperLink's only listener: a 0600 socket in the 0700 state dir.
        sock = dep.state.resolve() / SOCKET_NAME
        assert listening_unix_paths(tree[1:]) == {str(sock)}
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert stat.S_IMODE(dep.state.stat().st_mode) == 0o700
        if os.geteuid() == 0:  # another user can be played only by root
            results[f"uid {NOBODY} on {sock}"] = attack_socket_as_nobody(sock, flower_run)

        accepted = {
            target: {call: what for call, what in calls.items() if what.startswith("accepted")}
            for target, calls in results.items()
        }
        assert not any(accepted.values()), json.dumps(results, indent=1)

        # Nothing changed: the run goes on, no node was added.
        assert owner.runs()[flower_run].status == "running"
        assert {n.node_id for n in owner.nodes()} == nodes_before
        assert dep.run(rid)["status"] == "running"
        listed = dep.cli("clients", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert len(json.loads(listed.stdout)) == 1

        # The admin token still stops the run.
        r = dep.http.post(f"/runs/{rid}/stop", headers=dep.admin)
        assert r.status_code == 200, r.text
        dep.wait_status(rid, "stopped", 60)
        wait_for(lambda: owner.runs()[flower_run].status == "finished", 30, "the Flower run to end")
    finally:
        owner.close()


@pytest.mark.procs
@pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")
def test_the_socket_refuses_another_user_even_when_the_folder_is_open():
    """The socket's own mode holds without the state dir's: 0600, owner only."""
    from fedveil.server.coordinator.link_socket import bind_socket

    folder = Path(tempfile.mkdtemp(prefix="fv-sock-"))
    try:
        folder.chmod(0o755)
        listener = bind_socket(folder / SOCKET_NAME)
        with listener:
            result = attack_socket_as_nobody(folder / SOCKET_NAME, 1)
        assert result["connect"].startswith("PermissionError"), result
        assert not any(v.startswith("accepted") for v in result.values()), result
    finally:
        shutil.rmtree(folder, ignore_errors=True)
