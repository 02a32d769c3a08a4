"""A custom task's failures speak (issue 19): a broken contract is named before the run
starts (exit 2), a run in which every client failed exits non-zero with the first cause,
and settings a task cannot honour are refused instead of ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.simulations.failures import RunFailed
from fedveil.simulations.simulate_run import simulate

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _tasks_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # contract_tasks, as a user's module on the path


def run_task(capsys, tmp_path: Path, task: str, *args: str) -> tuple[int, str, str]:
    """`fedveil simulate --task contract_tasks:TASK ...` through the CLI's own entry point
    (in this process: a subprocess would spend most of a test importing torch)."""
    code = main(
        [
            "simulate",
            "--quiet",
            "--task",
            f"contract_tasks:{task}",
            "--rounds",
            "2",
            "--per-round",
            "3",
            "--out",
            str(tmp_path / "run"),
            "--set",
            "simulation.workers=1",
            *args,
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("task", "says"),
    [
        # Used to run to the end with every client failing, and exit 0.
        ("float_labels", ["labels float32", "integer class labels (torch.int64)", "y.long()"]),
        ("numpy_arrays", ["client_data(0).x is a numpy.ndarray", "expected a torch.Tensor"]),
        # Used to end in a raw TypeError traceback.
        ("no_arguments", ["no_arguments()", "cannot be called with the run config alone"]),
        ("returns_a_dict", ["returned dict, expected fedveil.tasks.Task"]),
        # Used to make every client fail (or a worker process die).
        ("wrong_input_size", ["forward pass failed on inputs of shape (32, 8)"]),
        # Used to train silently: cross-entropy accepts 3 logits for 2 classes.
        (
            "too_many_logits",
            [
                "the model outputs float32 of shape (32, 3)",
                "expected (batch, num_classes) = (32, 2)",
            ],
        ),
    ],
)
def test_a_broken_task_contract_is_named_before_the_run(capsys, tmp_path, task, says):
    code, _, err = run_task(capsys, tmp_path, task)
    assert code == 2, err
    for text in says:
        assert text in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing ran


def test_a_regression_task_with_its_own_loss_runs(capsys, tmp_path):
    code, out, err = run_task(capsys, tmp_path, "regression", "--json")
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["rounds"] == 2 and summary["test_loss"] is not None


def test_a_run_where_every_client_failed_exits_non_zero_with_the_cause(capsys, tmp_path):
    import contract_tasks

    contract_tasks._calls["n"] = 0
    code, _, err = run_task(capsys, tmp_path, "fails_after_the_check")
    assert code == 1, err
    assert "every client failed in all 2 round(s)" in err
    assert "expected target dtype to be Long" in err  # the first cause, without -v
    assert (tmp_path / "run" / "summary.json").exists()  # the run directory is still written


def test_every_client_failing_is_caught_under_central_dp_too(tmp_path):
    import contract_tasks

    contract_tasks._calls["n"] = 0
    cfg = load_config(
        None,
        {
            "model.task": "contract_tasks:fails_after_the_check",
            "data.num_clients": 6,
            "server.rounds": 2,
            "server.per_round": 3,
            "dp.mechanism": "central",  # every round is applied (noise alone) under DP
            "dp.epsilon": 50.0,
            "dp.noise_multiplier": 1.0,  # given, not calibrated: the test stays fast
            "simulation.workers": 1,
            "out": str(tmp_path / "dp"),
        },
    )
    with pytest.raises(RunFailed, match="expected target dtype to be Long"):
        simulate(cfg)


def test_flags_a_custom_task_ignores_are_refused(capsys, tmp_path):
    for args, flag in [
        (["--dataset", "digits"], "--dataset digits"),
        (["--model", "mlp"], "--model mlp"),
        (["--alpha", "0.1"], "--alpha 0.1"),
    ]:
        code, _, err = run_task(capsys, tmp_path, "good", *args)
        assert code == 2, err
        assert f"{flag}: the task 'contract_tasks:good' does not use" in err
    # The task has 6 clients whatever --clients says: refused, naming both.
    code, _, err = run_task(capsys, tmp_path, "good", "--clients", "50")
    assert code == 2, err
    assert "--clients 50: the task 'contract_tasks:good' has 6 clients" in err


def test_config_toml_records_the_task_actually_run(capsys, tmp_path):
    code, out, err = run_task(capsys, tmp_path, "good", "--json")
    assert code == 0, err
    text = (tmp_path / "run" / "config.toml").read_text()
    config = tomllib.loads(text)
    assert config["model"] == {"task": "contract_tasks:good"}
    assert config["data"] == {"num_clients": 6}  # the task's population, not the default 100
    assert "fashion-mnist" not in text and "cnn" not in text
    assert "# task 'contract-test' from contract_tasks:good: 6 clients" in text
    assert json.loads(out.splitlines()[-1])["clients"] == 6
