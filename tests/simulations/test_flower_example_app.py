"""examples/flower-app runs with `flwr run . --stream`, as the README shows: Flower's local
simulation federation, fedveil's apps, no `fedveil server`, fedveil from this environment
rather than the package index, and no FEDVEIL_STATE_DIR."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-app"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def flower_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """FLWR_HOME in tmp and the local SuperLink `flwr run` would start, started here on
    free ports (Flower's own fixed ones may be taken) so that the test can stop it."""
    env = {k: v for k, v in os.environ.items() if k != "FEDVEIL_STATE_DIR"}
    http_port, control_port = free_port(), free_port()
    env.update(
        FLWR_HOME=str(tmp_path / "flwr-home"),
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        FLWR_DISABLE_UPDATE_CHECK="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    log_dir = tmp_path / "flwr-home" / "local-superlink"
    log_dir.mkdir(parents=True)
    superlink = subprocess.Popen(
        [
            str(BIN / "flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--control-api-address",
            f"127.0.0.1:{control_port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(http_port),
            "--log-file",
            str(log_dir / "superlink.log"),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: stopped with its children below
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", http_port), timeout=0.5).close()
                break
            except OSError:
                assert superlink.poll() is None, "flower-superlink exited at start"
                assert time.monotonic() < deadline, "flower-superlink did not start in 60 s"
                time.sleep(0.3)
        yield env
    finally:
        os.killpg(superlink.pid, signal.SIGTERM)
        try:
            superlink.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(superlink.pid, signal.SIGKILL)
            superlink.wait()


@pytest.mark.flower
@pytest.mark.slow
def test_flwr_run_trains_the_example_app(tmp_path, flower_env):
    app = tmp_path / "flower-app"
    shutil.copytree(EXAMPLE, app)
    out = tmp_path / "run"
    proc = subprocess.run(
        [str(BIN / "flwr"), "run", ".", "--stream", "--run-config", f"out='{out}'"],
        cwd=app,
        env=flower_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Exit Code" not in log, log[-3000:]  # `flwr run` exits 0 even when the run fails
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_applied"] == summary["rounds"] == 3, summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["cohort_aggregated"] for r in rows] == [2, 2, 2]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert (out / "model.safetensors").is_file()
