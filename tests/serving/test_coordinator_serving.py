"""`[serving]` in server.toml: a real coordinator serves the promoted version of a model in
its registry on its own port, with its own token, and follows a promotion while running."""

from __future__ import annotations

import os
import re
import secrets
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from loopback_ports import free_port
from serve_harness import metric, predict_npz, request

from fedveil.config import ConfigError, load_config
from fedveil.config.service_settings import service_config
from fedveil.ops.procs import spawn, stop_group
from fedveil.server.registry import Registry
from fedveil.simulations.simulate_run import simulate

STARTED = re.compile(r"prediction API on (http://[^\s]+)")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    overrides = {
        "data.dataset": "digits",
        "model.name": "mlp",
        "server.rounds": 1,
        "data.num_clients": 4,
        "server.per_round": 4,
        "device": "cpu",
        "out": str(out),
    }
    simulate(load_config(None, overrides))
    return out


@pytest.mark.procs
def test_coordinator_serves_the_promoted_version_and_follows_promotion(
    run_dir: Path, tmp_path: Path
) -> None:
    registry = Registry(tmp_path / "state" / "registry")  # the coordinator's registry
    registry.register(run_dir, name="digits")
    registry.promote("digits", 1)
    token = secrets.token_urlsafe(24)
    (tmp_path / "predict.token").write_text(token)
    (tmp_path / "predict.token").chmod(0o600)
    (tmp_path / "server.toml").write_text(
        f"""state_dir = "state"
[api]
port = {free_port()}
[fleet]
port = {free_port()}
[serving]
enabled = true
models = ["digits"]
port = {free_port()}
token_file = "predict.token"
"""
    )
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    env.pop("FEDVEIL_ADMIN_TOKEN", None)
    log = tmp_path / "server.log"
    argv = [sys.executable, "-m", "fedveil.cli.main", "server", "--config", "server.toml"]
    with log.open("wb") as out:
        proc = spawn([*argv, "--insecure"], env=env, log=out, cwd=tmp_path)
    try:
        url = _wait_started(log, proc)
        x = np.zeros((3, 1, 8, 8), np.float32)
        assert predict_npz(url, "digits", x)[0] == 401  # its own token, required
        status, headers, _ = predict_npz(url, "digits", x, token)
        assert status == 200 and headers["x-fedveil-model-version"] == "1"
        # A promotion while serving: the next requests go to the new version.
        registry.register(run_dir, name="digits")
        registry.promote("digits", 2)
        deadline = time.monotonic() + 60
        while predict_npz(url, "digits", x, token)[1]["x-fedveil-model-version"] != "2":
            assert time.monotonic() < deadline, "promotion of digits@2 not followed"
            time.sleep(0.5)
        text = request(f"{url}/metrics")[2].decode()
        assert metric(text, "fedveil_serve_requests_total", version="1", code="200") >= 1
        assert metric(text, "fedveil_serve_requests_total", version="2", code="200") == 1
    finally:
        stop_group(proc)
    assert token not in log.read_text(errors="replace")


def _wait_started(log: Path, proc: object) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = STARTED.search(log.read_text(errors="replace"))
        if found:
            for _ in range(100):
                try:
                    if request(found.group(1) + "/readyz")[0] == 200:
                        return found.group(1)
                except OSError:
                    time.sleep(0.2)
            break
        if proc.poll() is not None:  # type: ignore[attr-defined]
            break
        time.sleep(0.2)
    raise AssertionError(f"coordinator's prediction API did not start:\n{log.read_text()}")


def test_serving_table_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"needs serving\.models"):
        service_config({"serving": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"needs serving\.token_file, or serving\.public"):
        service_config({"serving": {"enabled": True, "models": ["a"]}})
    with pytest.raises(ConfigError, match=r"serving\.max_batch"):
        service_config({"serving": {"max_batch": 0}})
    assert service_config({"serving": {"enabled": True, "models": ["a"], "public": True}})
