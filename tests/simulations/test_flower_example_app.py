"""examples/flower-app runs with the commands of docs/tutorials/flower-app.md as they stand:
`flwr run . --stream` on Flower's local simulation federation, fedveil's apps, no `fedveil
server`, fedveil from this environment rather than the package index, and no
FEDVEIL_STATE_DIR; then the same app with secure aggregation on three SuperNodes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from docs_pages import code_blocks, section
from flower_local_superlink import local_superlink

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-app"
BIN = Path(sys.executable).parent


@pytest.fixture
def flower_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """FLWR_HOME in tmp and the local SuperLink `flwr run` would start, started here on
    ports of the test's own (Flower's fixed ones may be taken) so that the test can stop
    it (tests/flower_local_superlink.py)."""
    env = {k: v for k, v in os.environ.items() if k != "FEDVEIL_STATE_DIR"}
    with local_superlink(tmp_path, env) as env:
        yield env


def tutorial_commands() -> list[list[str]]:
    """The `flwr run` lines of the tutorial's steps 1 and 2, as argv."""
    page = "tutorials/flower-app.md"
    found = []
    for heading in ("1. Run the example app", "2. The same app with fedveil's secure aggregation"):
        for block in code_blocks(section(page, heading), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:2] == ["flwr", "run"]:
                    found.append(words)
    assert len(found) == 2, f"docs/{page}: expected two flwr run commands, got {found}"
    return found


def with_out(argv: list[str], out: Path) -> list[str]:
    """argv with the run directory put in tmp: `out` added to its --run-config."""
    argv = list(argv)
    if "--run-config" in argv:
        i = argv.index("--run-config") + 1
        argv[i] = f"{argv[i]} out='{out}'"
        return argv
    return [*argv, "--run-config", f"out='{out}'"]


def flwr_run(argv: list[str], app: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [str(BIN / "flwr"), *argv[1:]],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Exit Code" not in log, log[-3000:]  # `flwr run` exits 0 even when the run fails
    return log


@pytest.mark.flower
@pytest.mark.slow
def test_flwr_run_trains_the_example_app(tmp_path, flower_env):
    app = tmp_path / "flower-app"
    shutil.copytree(EXAMPLE, app)
    plain, secure = tutorial_commands()
    out = tmp_path / "run"
    log = flwr_run(with_out(plain, out), app, flower_env)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_applied"] == summary["rounds"] == 3, summary
    assert summary["transport"] == "flower"  # used to say "inprocess"
    # Each round's figures reach Flower's log stream (it used to show no round at all).
    for n in (1, 2, 3):
        assert f"[fedveil] round {n}/3 applied: test_accuracy" in log, log[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["cohort_aggregated"] for r in rows] == [2, 2, 2]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert (out / "model.safetensors").is_file()

    # Step 2: the same app under secure aggregation, three SuperNodes.
    out = tmp_path / "secure-run"
    flwr_run(with_out(secure, out), app, flower_env)
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["secagg"]["enabled"] is True and config["data"]["num_clients"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["cohort_aggregated"] for r in rows] == [3, 3, 3]
    assert all(r["secagg_threshold"] >= 2 for r in rows), rows
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
