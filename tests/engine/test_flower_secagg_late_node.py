"""secure() serves a SuperNode that registers after the strategy sampled, on a real Flower
deployment: a SuperLink and SuperNodes as processes, the app submitted with `flwr run`.

Flower's FedAvg (its defaults: min_available_nodes = 2) sizes its sample from the nodes
connected when it configures the round. With two of three SuperNodes up it samples 2,
which secure aggregation cannot serve (3 at least); the wrapper used to refuse the run at
once. It now takes the strategy's own rule (every node: fraction_train = 1.0) on the
nodes connected, waiting (at most node_wait_s) for the third, and aggregates all three.
The third SuperNode is started only after FedAvg sampled (tests/flower_late_node_app.py
marks it), so the late registration is certain, not a race."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback_ports import free_port

from fedveil.ops.procs import child_env, flwr_command, spawn, stop_group, wait_port

pytestmark = [pytest.mark.flower, pytest.mark.procs]

TESTS = Path(__file__).resolve().parents[1]
APP = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "late-node-app"
version = "1.0.0"
description = "FedAvg under fedveil's secure(), with a SuperNode that registers late"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fedveil-tests"

[tool.flwr.app.components]
serverapp = "flower_late_node_app:app"
clientapp = "flower_secagg_app:app"

[tool.flwr.app.config]
result = ""
node-wait-s = 0.0
"""


class Federation:
    """A SuperLink and its SuperNodes on loopback, every process stopped at the end."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        home = root / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "here"\n\n[superlink.here]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        # The apps' modules from tests/; Flower's helpers from this interpreter's bin.
        pythonpath = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
        self.env = child_env(
            {"FLWR_HOME": str(home), "PYTHONPATH": pythonpath, "FLWR_DISABLE_UPDATE_CHECK": "1"}
        )
        self.procs: list = []

    def _start(self, name: str, argv: list[str]) -> None:
        log = (self.root / f"{name}.log").open("ab")
        self.procs.append(spawn(argv, env=self.env, log=log, cwd=self.root))

    def superlink(self) -> None:
        args = ["--insecure", "--isolation", "subprocess", "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--disable-runtime-dependency-installation"]
        self._start("superlink", flwr_command("flower-superlink", args))

    def supernode(self, partition: int) -> None:
        args = ["--insecure", "--superlink", f"127.0.0.1:{self.port}"]
        args += ["--port", str(free_port()), "--node-config", f"partition-id={partition}"]
        self._start(f"supernode-{partition}", flwr_command("flower-supernode", args))

    def flwr_run(self, app: Path, run_config: str) -> None:
        argv = [str(Path(sys.executable).parent / "flwr"), "run", str(app), "here"]
        self._start("flwr-run", [*argv, "--run-config", run_config])

    def stop(self) -> None:
        # SIGTERM to every process group at once, then one 5 s grace for all: one by one,
        # each SuperNode's leaving was waited in turn (15 s of teardown at load 12).
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            stop_group(proc, timeout=0.1)  # what is left of its group is SIGKILLed

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.root.glob("*.log"))
        )


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Federation]:
    fed = Federation(tmp_path)
    try:
        yield fed
    finally:
        fed.stop()


def wait_for_file(path: Path, timeout: float, fed: Federation) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} in {timeout:.0f} s\n{fed.logs()}"
        time.sleep(0.2)


@pytest.mark.timeout(420)
def test_a_supernode_registering_after_fedavg_sampled_is_waited_for(
    tmp_path: Path, federation: Federation
) -> None:
    federation.superlink()
    federation.supernode(0)
    federation.supernode(1)
    assert wait_port("127.0.0.1", federation.port, 90, federation.procs[0]), federation.logs()
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text(APP)
    result = tmp_path / "result.json"
    federation.flwr_run(app, f"result='{result}' node-wait-s=300.0")
    # FedAvg has sampled the two SuperNodes connected: only now does the third start.
    wait_for_file(result.with_suffix(".sampled"), 180, federation)
    federation.supernode(2)
    wait_for_file(result, 300, federation)
    out = json.loads(result.read_text())
    assert "error" not in out, out["error"]
    assert out["sampled"] == 2, out  # what FedAvg asked for, with 2 nodes connected
    # Its own rule (fraction_train = 1.0) on the nodes connected once the third came.
    assert out["rounds"] == [{"round": 1, "purpose": "train", "aggregated": 3}], out
