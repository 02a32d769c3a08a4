"""`fedveil simulate --resume --out DIR`, walked as the docs give it (issue 30): the run
continues under its own config.toml, conflicting flags are refused naming them, the
record is not overwritten, and Ctrl-C says how to continue."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedveil.cli.main import main

# digits + MLP, in process (simulation.workers = 1), the CSPRNG cohorts off so that the
# interrupted-and-resumed run can equal the straight one bit for bit.
DIGITS = [
    "--dataset",
    "digits",
    "--clients",
    "10",
    "--per-round",
    "4",
    "--set",
    "simulation.workers=1",
]


def _interrupt_after(out: Path, rounds: int) -> threading.Thread:
    """Ctrl-C (SIGINT to this process) once `rounds` rounds are in metrics.jsonl."""

    def watch() -> None:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= rounds:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _simulate(*args: str) -> int:
    return main(["simulate", "--quiet", *args])


def _interrupted_run(out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    watcher = _interrupt_after(out, 2)
    code = _simulate(*DIGITS, "--rounds", "6", "--out", str(out), *extra)
    watcher.join()
    err = capsys.readouterr().err
    assert code == 130, err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    return err


def test_ctrl_c_then_the_documented_resume_gives_the_uninterrupted_model(tmp_path, capsys):
    # Used to load the defaults (Fashion-MNIST, CNN, 100 clients) and fail with
    # "array 'model' has 9610 values, expected 80202", overwriting config.toml.
    straight = tmp_path / "straight"
    assert _simulate(*DIGITS, "--rounds", "6", "--out", str(straight)) == 0
    out = tmp_path / "run"
    err = _interrupted_run(out, capsys)
    assert f"fedveil simulate --resume --out {out}" in err  # the exact command to continue
    recorded = (out / "config.toml").read_bytes()

    assert _simulate("--resume", "--out", str(out)) == 0, capsys.readouterr().err
    assert (out / "config.toml").read_bytes() == recorded  # never overwritten
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 6 and summary["task"] == "digits/mlp"
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").open()]
    assert rounds == [1, 2, 3, 4, 5, 6]
    a, b = load_file(straight / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_dp_run_resumes_under_its_plan_and_its_ledger_verifies(tmp_path, capsys):
    out = tmp_path / "dp"
    _interrupted_run(out, capsys, "--dp", "central", "--epsilon", "8")
    assert _simulate("--resume", "--out", str(out)) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 6 and summary["task"] == "digits/mlp"
    capsys.readouterr()
    assert main(["privacy", "verify", str(out)]) == 0, capsys.readouterr()
    # a DP plan is calibrated to its planned rounds: extending them is refused
    assert _simulate("--resume", "--out", str(out), "--rounds", "9") == 2
    assert "server.rounds = 9, the run has 6" in capsys.readouterr().err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume") / "run"
    assert _simulate(*DIGITS, "--rounds", "1", "--out", str(out)) == 0
    return out


@pytest.mark.parametrize(
    ("flag", "key"),
    [
        (["--seed", "3"], "seed = 3, the run has 0"),
        (["--clients", "12"], "data.num_clients = 12, the run has 10"),
        (["--dataset", "synthetic"], "data.dataset = 'synthetic', the run has 'digits'"),
        (["--dp", "central", "--epsilon", "8"], "dp.mechanism = 'central', the run has 'none'"),
    ],
)
def test_flags_that_conflict_with_the_checkpoint_are_refused_naming_them(
    finished_run, capsys, flag, key
):
    out = finished_run
    recorded = (out / "config.toml").read_bytes()
    assert _simulate("--resume", "--out", str(out), *flag) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedveil: error: --resume: ") and key in err, err
    assert "conflict with the checkpoint" in err
    assert (out / "config.toml").read_bytes() == recorded
