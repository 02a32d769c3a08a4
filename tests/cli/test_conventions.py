"""Command-line conventions (issue 19): --version, shell completion, built-in datasets on
their own defaults, --resume without a checkpoint, and SIGTERM leaving a usable run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from fedveil.cli.main import main

TESTS = Path(__file__).parents[1]


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "fedveil 0.1.0"


def test_bash_completion_knows_the_commands_and_flags(capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete " in script
    for word in ("simulate", "privacy", "--dataset", "--noise-multiplier"):
        assert word in script


@pytest.mark.parametrize(("dataset", "model"), [("synthetic", "mlp"), ("digits", "mlp")])
def test_every_builtin_dataset_runs_on_its_defaults(capsys, tmp_path, dataset, model):
    # Used to fail: "model 'cnn' needs image input" (synthetic), and no Dirichlet split of
    # digits' 1,437 images into 100 clients of at least 10 (digits).
    out = tmp_path / dataset
    code = main(
        [
            "simulate",
            "--quiet",
            "--dataset",
            dataset,
            "--rounds",
            "1",
            "--out",
            str(out),
            "--set",
            "simulation.workers=1",
            "--json",
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(stdout.splitlines()[-1])["task"] == f"{dataset}/{model}"
    assert f"dataset {dataset}: model.name = '{model}'" in err  # says what it chose


def test_an_explicit_model_is_kept_over_the_dataset_default(capsys, tmp_path):
    code = main(
        [
            "simulate",
            "--quiet",
            "--dataset",
            "synthetic",
            "--model",
            "logreg",
            "--rounds",
            "1",
            "--out",
            str(tmp_path / "r"),
            "--set",
            "simulation.workers=1",
            "--json",
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(stdout.splitlines()[-1])["task"] == "synthetic/logreg"


def test_resume_without_a_checkpoint_is_refused_naming_the_path(capsys, tmp_path):
    # Used to start a fresh run silently.
    out = tmp_path / "never-ran"
    code = main(["simulate", "--quiet", "--resume", "--task", "tiny_task:make", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--resume: no checkpoint at {out / 'checkpoint' / 'state.pt'}" in err
    assert not out.exists()


@pytest.mark.procs
def test_sigterm_leaves_the_last_rounds_model_and_an_interrupted_summary(tmp_path):
    # Used to leave only the checkpoint: no model file, no summary.
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedveil.cli.main",
            "simulate",
            "--quiet",
            "--task",
            "tiny_task:make",
            "--clients",
            "6",
            "--per-round",
            "3",
            "--rounds",
            "100000",
            "--out",
            str(out),
            "--set",
            "simulation.workers=1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted"] is True
    done = len(metrics.read_text().splitlines())
    assert 2 <= summary["rounds"] == done < 100000
    assert load_file(out / "model.safetensors")  # the last completed round's model


@pytest.mark.procs
def test_an_interrupted_dp_run_has_its_summary_and_a_ledger_verify_calls_interrupted(
    tmp_path, capsys
):
    from fedveil.config import load_config
    from fedveil.simulations.simulate_run import simulate

    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 4,
            "server.rounds": 5,
            "dp.mechanism": "central",
            "dp.epsilon": 50.0,
            "dp.noise_multiplier": 1.0,  # given, not calibrated: fast
            "simulation.workers": 1,
            "out": str(tmp_path / "dp"),
        },
    )

    def ctrl_c_after_round_2(record) -> None:
        if record.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate(cfg, on_round=ctrl_c_after_round_2)
    summary = json.loads((tmp_path / "dp" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 2
    assert "epsilon" in summary and "rounds_applied" not in summary  # DP's public summary
    assert main(["privacy", "verify", str(tmp_path / "dp")]) == 3  # interrupted, not truncated
    assert "interrupted at training round 2" in capsys.readouterr().err
