"""Experiment tracking ([tracking], --tensorboard, --mlflow): what a user reads back.

The event files are read with TensorBoard's own EventAccumulator and the MLflow store
with MlflowClient, as a user's dashboard would. Under DP the trackers must publish no
more than metrics.jsonl does (RoundRecord.public_json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fedveil.cli.main import main
from fedveil.config import ConfigError, load_config
from fedveil.server.engine.round_record import PUBLIC_UNDER_DP
from fedveil.server.engine.tracking import mlflow_tracking_uri
from fedveil.simulations.simulate_run import simulate

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is not installed (pip install 'fedveil[tracking]')",
)
mlflow_client = pytest.importorskip(
    "mlflow.tracking", reason="mlflow is not installed (pip install 'fedveil[tracking]')"
)


def tracked_config(tmp_path: Path, **extra: object):
    values: dict[str, object] = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 3,
        "simulation.workers": 1,
        "simulation.plots": False,
        "out": str(tmp_path / "run"),
        "tracking.tensorboard": str(tmp_path / "tb"),
        "tracking.mlflow_uri": str(tmp_path / "mlruns"),
    }
    values.update(extra)
    return load_config(None, values)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the one run logged under the TensorBoard root (its own subdirectory)."""
    runs = [d for d in log_dir.iterdir() if d.is_dir()]
    assert len(runs) == 1, runs
    acc = event_accumulator.EventAccumulator(str(runs[0]))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def only_mlflow_run(store: Path):
    client = mlflow_client.MlflowClient(tracking_uri=mlflow_tracking_uri(str(store)))
    experiment = client.get_experiment_by_name("fedveil")
    assert experiment is not None, "no 'fedveil' experiment in the MLflow store"
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def metric_steps(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def metrics_lines(cfg) -> list[dict]:
    return [json.loads(line) for line in Path(cfg.out, "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_and_mlflow_hold_params_rounds_and_model(tmp_path):
    cfg = tracked_config(tmp_path)
    simulate(cfg)
    lines = metrics_lines(cfg)
    want = [(r["round"], r["test_accuracy"]) for r in lines]

    tb = scalars(tmp_path / "tb")
    assert [s for s, _ in tb["test_accuracy"]] == [1, 2, 3]
    assert [v for _, v in tb["test_accuracy"]] == pytest.approx([v for _, v in want])
    assert "cohort_aggregated" in tb  # no DP: the whole record is public

    client, run = only_mlflow_run(tmp_path / "mlruns")
    assert run.info.status == "FINISHED"
    assert run.data.params["server.rounds"] == "3"
    assert run.data.params["model.task"] == "tiny_task:make"
    assert metric_steps(client, run.info.run_id, "test_accuracy") == want  # float64, exact
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.safetensors", "summary.json", "config.toml"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "model.safetensors", str(tmp_path)))
    assert local.read_bytes() == Path(cfg.out, "model.safetensors").read_bytes()


def test_under_dp_trackers_publish_only_what_metrics_jsonl_publishes(tmp_path):
    cfg = tracked_config(
        tmp_path,
        **{
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "dp.clip": 0.5,
            "dp.noise_multiplier": 3.0,
        },
    )
    simulate(cfg)
    public_keys = {k for line in metrics_lines(cfg) for k in line}

    tb = scalars(tmp_path / "tb")
    client, run = only_mlflow_run(tmp_path / "mlruns")
    for shown in (set(tb), set(run.data.metrics)):
        assert shown <= PUBLIC_UNDER_DP & public_keys, shown - PUBLIC_UNDER_DP
        # cohort sizes, drops and client-reported losses reveal participation or data
        assert not shown & {"cohort_aggregated", "cohort_planned", "dropped", "train_loss"}
    epsilons = metric_steps(client, run.info.run_id, "epsilon")
    assert [s for s, _ in epsilons] == [1, 2, 3]
    assert all(0 < e <= 8.0 for _, e in epsilons)
    assert [s for s, _ in tb["epsilon"]] == [1, 2, 3]


def test_under_dp_sgd_alone_trackers_publish_no_client_figure(tmp_path):
    # The observer of TensorBoard and MLflow: no per-client DP-SGD epsilon (it inverts to
    # one client's n), no client losses, no counts; as metrics.jsonl.
    cfg = tracked_config(tmp_path, **{"client.dp_sgd_noise": 1.0, "client.dp_sgd_clip": 1.0})
    simulate(cfg)
    public_keys = {k for line in metrics_lines(cfg) for k in line}
    tb = scalars(tmp_path / "tb")
    _, run = only_mlflow_run(tmp_path / "mlruns")
    for shown in (set(tb), set(run.data.metrics)):
        assert shown <= PUBLIC_UNDER_DP & public_keys, shown - PUBLIC_UNDER_DP
        assert "test_accuracy" in shown
        assert not shown & {"dp_sgd_epsilon_max", "train_loss", "cohort_aggregated", "dropped"}


class Stop(KeyboardInterrupt):
    pass


def test_an_interrupted_run_flushes_its_rounds_and_is_marked_killed(tmp_path):
    cfg = tracked_config(tmp_path, **{"server.rounds": 5})

    def ctrl_c_after_round_2(record):
        if record.round == 2:
            raise Stop

    with pytest.raises(KeyboardInterrupt):
        simulate(cfg, on_round=ctrl_c_after_round_2)

    assert [s for s, _ in scalars(tmp_path / "tb")["test_accuracy"]] == [1, 2]
    client, run = only_mlflow_run(tmp_path / "mlruns")
    assert run.info.status == "KILLED"
    assert run.data.tags["fedveil.status"] == "interrupted"
    assert [s for s, _ in metric_steps(client, run.info.run_id, "test_accuracy")] == [1, 2]
    assert "model.safetensors" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.parametrize(
    ("flag", "module"), [("--mlflow", "mlflow"), ("--tensorboard", "tensorboard")]
)
def test_a_missing_extra_is_refused_before_the_run_with_the_install_line(
    tmp_path, monkeypatch, capsys, flag, module
):
    monkeypatch.setitem(sys.modules, module, None)  # what Python sees when it is not installed
    out = tmp_path / "run"
    code = main(
        ["simulate", "--task", "tiny_task:make", "--out", str(out), flag, str(tmp_path / "t")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert f"the {module!r} package is not installed" in err
    assert "pip install 'fedveil[tracking]'" in err
    assert not out.exists(), "nothing may be written before the refusal"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tracking.mlflow_uri": "ftp://host/runs"}, "tracking.mlflow_uri = 'ftp://host/runs'"),
        (
            {"tracking.mlflow_uri": "mlruns", "tracking.mlflow_experiment": " "},
            "tracking.mlflow_experiment = ' '",
        ),
        ({"tracking.board": "x"}, "unknown key tracking.board"),
    ],
)
def test_tracking_settings_are_checked_up_front(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(None, overrides)


def test_tracking_is_off_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # One worker: in process (fast tier); tracking does not depend on the worker count.
    values = {"model.task": "tiny_task:make", "server.rounds": 1, "out": "run"}
    cfg = load_config(None, {**values, "simulation.workers": 1})
    assert cfg.tracking.tensorboard == cfg.tracking.mlflow_uri == ""
    simulate(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no mlruns/, no runs/


def test_a_directory_or_file_uri_is_a_local_store_found_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A directory is a SQLite store in it: MLflow 3 reads it back with no extra setting.
    assert mlflow_tracking_uri("mlruns") == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    assert mlflow_tracking_uri("file:./mlruns") == (tmp_path / "mlruns").as_uri()
    assert mlflow_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_a_resumed_run_continues_the_event_steps_in_a_new_mlflow_run(tmp_path):
    cfg = tracked_config(tmp_path, **{"server.rounds": 4})

    def ctrl_c_after_round_2(record):
        if record.round == 2:
            raise Stop

    with pytest.raises(KeyboardInterrupt):
        simulate(cfg, on_round=ctrl_c_after_round_2)
    simulate(cfg, resume=True)

    assert [s for s, _ in scalars(tmp_path / "tb")["test_accuracy"]] == [1, 2, 3, 4]
    client = mlflow_client.MlflowClient(tracking_uri=mlflow_tracking_uri(str(tmp_path / "mlruns")))
    experiment = client.get_experiment_by_name("fedveil")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])
    assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
    steps = [[s for s, _ in metric_steps(client, r.info.run_id, "test_accuracy")] for r in runs]
    assert steps == [[1, 2], [3, 4]]


def test_two_runs_get_a_tensorboard_run_each_and_log_only_the_settings_they_use(tmp_path):
    # Used to write both runs' events into one directory, and to log all 105 settings
    # (poisoning.*, audit.*, the async ones) whatever the run used.
    first = tracked_config(tmp_path, **{"server.rounds": 1, "out": str(tmp_path / "a")})
    second = tracked_config(tmp_path, **{"server.rounds": 1, "out": str(tmp_path / "b")})
    simulate(first)
    simulate(second)
    runs = sorted(d.name for d in (tmp_path / "tb").iterdir())
    assert len(runs) == 2 and runs[0].startswith("a-") and runs[1].startswith("b-")
    client = mlflow_client.MlflowClient(tracking_uri=mlflow_tracking_uri(str(tmp_path / "mlruns")))
    experiment = client.get_experiment_by_name("fedveil")
    params = client.search_runs([experiment.experiment_id])[0].data.params
    assert params["poisoning.attack"] == "none" and params["dp.mechanism"] == "none"
    unused = [k for k in params if k.startswith(("poisoning.", "audit.", "dp.", "secagg."))]
    assert sorted(unused) == ["dp.mechanism", "poisoning.attack", "secagg.enabled"]
    assert "server.concurrency" not in params  # a sync run
    assert params["client.lr"] and params["server.rounds"] == "1"
