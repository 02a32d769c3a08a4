"""`fedveil simulate --resume --out DIR`, walked as the docs give it (issue 30): the run
continues under its own config.toml, conflicting flags are refused naming them, the
record is not overwritten, and Ctrl-C says how to continue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from fedveil.cli.main import main
from tiny_task import EVAL_GATE_FILE, EVAL_GATE_ROUND

TESTS = Path(__file__).parents[1]
ROUNDS = 30

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


def _simulate(*args: str) -> int:
    return main(["simulate", "--quiet", *args])


def _env() -> dict[str, str]:
    # One torch thread in every process of a comparison: a thread count another test
    # set in this process would change the last bits of a sum (not what is tested).
    return dict(os.environ, PYTHONPATH=str(TESTS), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`fedveil simulate ARGS` in a process of its own, as a user runs it."""
    argv = [sys.executable, "-m", "fedveil.cli.main", "simulate", "--quiet", *args]
    return subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300)


def _interrupted_run(out: Path, *extra: str) -> str:
    """`fedveil simulate` in a process of its own, Ctrl-C'd (SIGINT) once two rounds are
    in metrics.jsonl, as a user at a terminal would: what it printed. 30 rounds, so the
    signal lands long before the run could end however busy the machine is."""
    argv = [sys.executable, "-m", "fedveil.cli.main", "simulate", "--quiet", *DIGITS]
    proc = subprocess.Popen(
        [*argv, "--rounds", str(ROUNDS), "--out", str(out), *extra],
        env=_env(),
        # A terminal's Ctrl-C: SIGINT at its default, which Python turns into
        # KeyboardInterrupt. A background job of a non-interactive shell (CI started with
        # `&`) inherits SIGINT ignored, and Python then leaves it ignored.
        preexec_fn=_sigint_default,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    return err


@pytest.mark.procs
def test_ctrl_c_then_the_documented_resume_gives_the_uninterrupted_model(tmp_path):
    # Used to load the defaults (Fashion-MNIST, CNN, 100 clients) and fail with
    # "array 'model' has 9610 values, expected 80202", overwriting config.toml.
    # Every run is a process of its own with one torch thread, so that bit-for-bit
    # equality compares resuming, nothing else.
    straight = tmp_path / "straight"
    done = _cli(*DIGITS, "--rounds", str(ROUNDS), "--out", str(straight))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "run"
    err = _interrupted_run(out)
    assert f"fedveil simulate --resume --out {out}" in err  # the exact command to continue
    # The round it names is the last one kept (it named the round in flight, one more
    # than metrics.jsonl holds, when the signal landed during its evaluation).
    kept = len((out / "metrics.jsonl").read_text().splitlines())
    assert f"interrupted after round {kept}: model and summary written" in err, err
    recorded = (out / "config.toml").read_bytes()

    resumed = _cli("--resume", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "config.toml").read_bytes() == recorded  # never overwritten
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["task"] == "digits/mlp"
    assert summary["rounds_applied"] == ROUNDS  # the whole run's, not the resumed part's
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").open()]
    assert rounds == list(range(1, ROUNDS + 1))
    a, b = load_file(straight / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.procs
def test_a_dp_run_resumes_under_its_plan_and_its_ledger_verifies(tmp_path, capsys):
    out = tmp_path / "dp"
    _interrupted_run(out, "--dp", "central", "--epsilon", "8")
    assert _simulate("--resume", "--out", str(out)) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["task"] == "digits/mlp"
    capsys.readouterr()
    assert main(["privacy", "verify", str(out)]) == 0, capsys.readouterr()
    # a DP plan is calibrated to its planned rounds: extending them is refused
    assert _simulate("--resume", "--out", str(out), "--rounds", "40") == 2
    assert f"server.rounds = 40, the run has {ROUNDS}" in capsys.readouterr().err


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


def test_an_init_model_of_another_task_is_refused_naming_both_tasks(finished_run, tmp_path, capsys):
    # Followed from the registry how-to with another run's model: "model file lacks
    # tensor 'features.0.weight'", naming neither model nor what to do.
    model = finished_run / "model.safetensors"
    args = ["--dataset", "digits", "--model", "logreg", "--rounds", "1"]
    assert _simulate(*args, "--init-model", str(model), "--out", str(tmp_path / "r")) == 2
    err = capsys.readouterr().err
    assert f"fedveil: error: init model {model}: " in err, err
    assert "it holds a digits/mlp model and this run trains digits/logreg" in err
    assert "--config RUN_DIR/config.toml" in err


def test_resuming_a_finished_run_changes_nothing_and_says_how_to_go_further(tmp_path, capsys):
    # Used to "resume" with nothing to train and rewrite summary.json with test_accuracy
    # null and rounds_applied 0: a finished run's result lost to a stray --resume.
    out = tmp_path / "run"
    assert _simulate(*DIGITS, "--rounds", "1", "--out", str(out)) == 0
    before = {name: (out / name).read_bytes() for name in ("summary.json", "model.safetensors")}
    capsys.readouterr()
    assert _simulate("--resume", "--out", str(out)) == 0
    err = capsys.readouterr().err
    assert f"{out} already finished its 1 rounds (summary.json); nothing to resume" in err
    assert "--rounds N with N > 1" in err and "--init-model" in err
    assert {name: (out / name).read_bytes() for name in before} == before


def test_a_resumed_runs_summary_counts_the_rounds_before_the_resume(tmp_path, capsys):
    # It counted only the rounds since the resume: "rounds": 4, "rounds_applied": 2.
    out = tmp_path / "run"
    assert _simulate(*DIGITS, "--rounds", "2", "--out", str(out)) == 0
    assert _simulate("--resume", "--out", str(out), "--rounds", "4") == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["rounds"], summary["rounds_applied"], summary["dropped_total"]) == (4, 4, 0)


@pytest.mark.procs
def test_ctrl_c_during_a_rounds_evaluation_keeps_the_round_before_everywhere(tmp_path):
    # Ctrl-C while round 3 was evaluated: summary.json said 3 rounds and model.safetensors
    # held round 3's stepped model, while metrics.jsonl and the checkpoint (where a resume
    # starts) ended at round 2. The gated task's round-3 evaluation says when it is there.
    out, gate = tmp_path / "run", tmp_path / "evaluating"
    env = {**_env(), EVAL_GATE_FILE: str(gate), EVAL_GATE_ROUND: "3"}
    tiny = ["--task", "tiny_task:make_gated_eval", "--clients", "6", "--per-round", "3"]
    tiny += ["--set", "simulation.workers=1", "--set", "simulation.plots=false"]
    argv = [sys.executable, "-m", "fedveil.cli.main", "simulate", "--quiet", *tiny]
    proc = subprocess.Popen(
        [*argv, "--rounds", "5", "--out", str(out)],
        env=env,
        preexec_fn=_sigint_default,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180
    while not gate.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err

    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").open()]
    checkpoint = torch.load(out / "checkpoint" / "state.pt", weights_only=False)
    summary = json.loads((out / "summary.json").read_text())
    assert rounds == [1, 2] and checkpoint["round"] == 2
    assert summary["status"] == "interrupted" and summary["rounds"] == 2
    assert "interrupted after round 2: model and summary written" in err, err
    with safe_open(out / "model.safetensors", "pt") as model:  # the checkpoint's model
        assert model.metadata()["round"] == "2"
        names = ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias")
        weights = torch.cat([model.get_tensor(n).flatten() for n in names])
    assert torch.equal(weights, checkpoint["weights"])

    env[EVAL_GATE_ROUND] = "0"  # no gate
    cmd = [*argv, "--resume", "--out", str(out)]
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").open()]
    assert rounds == [1, 2, 3, 4, 5]
    assert json.loads((out / "summary.json").read_text())["rounds"] == 5
