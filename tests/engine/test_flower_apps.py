"""fedveil.flower: the run config a Flower app gives, and fedveil's own pair of apps."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import pytest
from flower_local_superlink import local_superlink
from flwr.simulation import run_simulation
from local_ray import local_ray

from fedveil.config import ConfigError, load_config
from fedveil.flower import client_app, run_config_of, server_app
from fedveil.server.engine.flower_stock_codec import error_essence
from fedveil.server.engine.privacy_report import verify_run


@pytest.mark.procs
def test_run_config_of_reads_a_path_and_flattened_keys(tmp_path):
    path = tmp_path / "fedveil.toml"
    path.write_text("seed = 7\n[server]\nrounds = 9\nper_round = 2\n")
    cfg = run_config_of(
        {
            "fedveil-config": str(path),
            "server.rounds": 2,  # [tool.flwr.app.config] server.rounds, as Flower flattens it
            "fedveil.data.num_clients": 5,  # namespaced among the app's own keys
            "num-server-rounds": 30,  # the app's own key: not fedveil's, ignored
            "lr": 0.5,
        }
    )
    assert (cfg.seed, cfg.server.rounds, cfg.server.per_round) == (7, 2, 2)
    assert cfg.data.num_clients == 5 and cfg.client.lr == load_config().client.lr


def test_run_config_of_names_a_misspelt_fedveil_key():
    with pytest.raises(ConfigError, match=r"server\.roundz"):
        run_config_of({"server.roundz": 3})


def test_client_errors_read_as_their_cause_whatever_process_raised_them():
    # Flower's simulation engine wraps a ClientApp's exception in Ray's text, with the
    # actor's pid: without unwrapping, one cause counted as as many reasons as processes.
    def ray_reason(pid: int) -> str:
        return (
            "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor"
            f".run() (pid={pid}, ip=192.0.2.2)\n  File ...\nException ClientAppException "
            "occurred. Message: model.task = 'x:make': cannot import 'x''>"
        )

    assert error_essence(ray_reason(1)) == error_essence(ray_reason(2))
    assert error_essence(ray_reason(1)) == "model.task = 'x:make': cannot import 'x'"
    assert error_essence("<class 'ValueError'>:<'boom'>") == "ValueError: boom"


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.parametrize("dp", [False, True], ids=["plain", "central-dp"])
def test_fedveil_client_app_under_fedveil_server_app(tmp_path, dp):
    # Central DP: the ServerApp's ledger binds the model it writes (model_sha256).
    private = {"dp.mechanism": "central", "dp.epsilon": 50.0} if dp else {}
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 4,
            "server.per_round": 4,
            "server.rounds": 2,
            "device": "cpu",
            "out": str(tmp_path / "run"),
            **private,
        },
    )
    local_ray()
    run_simulation(
        server_app=server_app(cfg),
        client_app=client_app(cfg),
        num_supernodes=4,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert (Path(cfg.out) / "model.safetensors").exists()
    if not dp:
        assert summary["rounds_applied"] == 2 and summary["first_client_error"] is None
        return
    model = (Path(cfg.out) / "model.safetensors").read_bytes()
    closing = json.loads((Path(cfg.out) / "privacy" / "ledger.jsonl").read_text().splitlines()[-1])
    assert closing["kind"] == "final" and closing["training_round"] == 2
    assert closing["model_sha256"] == hashlib.sha256(model).hexdigest()
    assert verify_run(Path(cfg.out)).ok


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.slow
def test_clients_that_fail_to_join_are_named_with_their_error(tmp_path):
    """Not 'only 0 of N clients answered within 600 s': what the nodes answered."""
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 3,
        "server.per_round": 3,
        "server.rounds": 1,
        "device": "cpu",
        "out": str(tmp_path / "run"),
    }
    cfg = load_config(None, values)
    broken = load_config(None, {**values, "model.task": "no_such_task_module:make"})
    local_ray()
    with pytest.raises(RuntimeError, match="only 0 of 3 clients joined") as err:
        run_simulation(
            server_app=server_app(cfg),
            client_app=client_app(broken),
            num_supernodes=3,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
    assert "3 of 3 nodes answered with errors" in str(err.value)
    assert "3 x model.task = 'no_such_task_module:make': cannot import" in str(err.value)


APP_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedveil-flwr-run-test"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedveil-tests"

[tool.flwr.app.components]
serverapp = "fedveil.flower:server"
clientapp = "fedveil.flower:client"

[tool.flwr.app.config]
model.task = "tiny_task:make"
data.num_clients = 3
server.per_round = 3
server.rounds = 2
device = "cpu"
out = "{out}"
num-server-rounds = 7   # the app's own key: fedveil ignores it

[tool.flwr.federations]
default = "local-simulation"

[tool.flwr.federations.local-simulation]
options.num-supernodes = 3
"""


def _end_processes_with(marker: str) -> None:
    """End what the run left behind outside the SuperLink's process group (which
    local_superlink stops): the processes whose environment holds this test's own
    FLWR_HOME, one by one; never another test's."""
    import os
    import signal

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.slow
def test_flwr_run_builds_the_run_from_the_apps_config(tmp_path, tiny_env):
    """`flwr run .` with fedveil's module-level apps: the run comes from the app's
    [tool.flwr.app.config] (fedveil's keys read, the app's own ignored)."""
    import subprocess
    import sys

    app, out, home = tmp_path / "app", tmp_path / "run", tmp_path / "flwr-home"
    app.mkdir()
    (app / "pyproject.toml").write_text(APP_PYPROJECT.replace("{out}", str(out)))
    try:
        # Its local SuperLink on ports of its own, not Flower's fixed 39091/39093 where
        # another session's could answer (tests/flower_local_superlink.py).
        with local_superlink(tmp_path, tiny_env) as env:
            assert env["FLWR_HOME"] == str(home)
            done = subprocess.run(
                [str(Path(sys.executable).parent / "flwr"), "run", ".", "--stream"],
                cwd=app,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
    finally:
        _end_processes_with(f"FLWR_HOME={home}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["rounds_applied"] == 2
    assert summary["clients"] == 3 and summary["first_client_error"] is None
