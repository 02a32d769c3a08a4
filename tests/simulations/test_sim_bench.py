"""`fedveil bench simulation` end to end on a small workload."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedveil.benchmarks.bench_simulation import machine, measure, ours_config, run_ours
from fedveil.benchmarks.bench_workload import Workload
from fedveil.simulations.sequential_clients import SequentialClients


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedveil.cli.main", "bench", "simulation", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.procs
def test_bench_reports_ours_against_the_bare_loop():
    proc = bench(
        "--clients", "8", "--per-round", "6", "--rounds", "3", "--examples", "20", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary["results"]) == {"bare", "ours", "ours_1"}
    ours = summary["results"]["ours"]
    assert len(ours["round_s"]) == 3 and ours["workers"] >= 1
    assert ours["peak_rss_mb"] > 50 and ours["startup_s"] > 0
    assert summary["bare_ratio"] == pytest.approx(
        ours["round_s_median"] / summary["results"]["bare"]["round_s_median"]
    )
    assert "ratio" not in summary  # no peer asked for
    assert summary["torch_version"] == machine()["torch_version"] and summary["cpu_model"]
    # same workload, same learning: the engine's clients see the data the bare loop's see
    losses = {k: r["train_loss"] for k, r in summary["results"].items()}
    assert losses["ours"] == pytest.approx(losses["ours_1"], rel=1e-6)
    assert losses["ours"][0] == pytest.approx(losses["bare"][0], rel=0.05)
    assert "ours / bare loop" in proc.stderr


def test_the_report_names_the_torch_build_and_the_cpu():
    # Two runs of the same code are comparable only on the same torch and CPU: the bare
    # loop's round fell 3.6x between two quiet runs whose report recorded neither.
    import torch

    info = machine()
    assert info["torch_version"] == torch.__version__
    assert info["cpu_model"] and info["cpu_model"] != "n/a"


def test_our_contender_trains_clients_in_units(monkeypatch):
    trained: list[int] = []
    real = SequentialClients._train_unit
    monkeypatch.setattr(
        SequentialClients,
        "_train_unit",
        lambda self, unit: trained.append(len(unit)) or real(self, unit),
    )
    result = run_ours(Workload(clients=40, per_round=40, rounds=1, examples=20, pool=200), 1)
    assert result["vmap_clients"] == 32 and sum(trained) == 40 and max(trained) > 1


def test_our_contender_runs_the_products_lifecycle_and_times_its_rounds(tmp_path):
    # Ours is `fedveil simulate`'s run, not a copy of it: the run directory it leaves is
    # the one the lifecycle writes, and its round times are the engine's recorded ones.
    w = Workload(clients=8, per_round=6, rounds=2, examples=20, pool=200)
    result = run_ours(w, 1, run_dir=tmp_path)
    assert {"metrics.jsonl", "model.safetensors", "summary.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [1, 2]
    assert result["round_s"] == [m["duration_s"] for m in metrics]
    assert result["train_loss"] == [m["train_loss"] for m in metrics]
    assert len(result["round_cpu_s"]) == 2
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 2


@pytest.mark.procs
def test_population_mode_reports_memory_growth():
    proc = bench("--population", "50,500", "--per-round", "5", "--rounds", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [row["clients"] for row in summary["population"]] == [50, 500]
    assert summary["memory_growth"] > 0.5


def test_bad_arguments_name_the_flag(fedveil_cli):
    proc = fedveil_cli("bench", "simulation", "--clients", "5", "--per-round", "9")
    assert proc.returncode == 2
    assert "per_round = 9: must be in [1, 5]" in proc.stderr


@pytest.mark.flower
@pytest.mark.slow
def test_the_flower_peer_runs_the_same_workload():
    w = Workload(clients=4, per_round=4, rounds=2, examples=20, pool=200)
    flower = measure("flower", w)
    assert len(flower["round_s"]) == 2 and flower["processes"] > 3  # Ray's processes counted
    assert flower["peak_rss_mb"] > flower["end_pss_mb"] > 100
    ours = measure("ours", w)
    # the same data and model: the first round's mean training loss agrees closely
    assert flower["train_loss"][0] == pytest.approx(ours["train_loss"][0], rel=0.05)


def test_our_contender_trains_with_the_bare_loops_plain_sgd():
    # The bare loop and the Flower peer run torch.optim.SGD(lr) and FedAvg
    # (bench_workload.local_epoch): ours must do the same work, not the default job's
    # momentum (which costs two more passes over every client's parameters per step).
    w = Workload(clients=8, per_round=6, rounds=2, examples=20, pool=200)
    cfg = ours_config(w)
    assert (cfg.client.momentum, cfg.client.weight_decay, cfg.client.prox_mu) == (0, 0, 0)
    assert (cfg.client.local_epochs, cfg.client.local_steps) == (1, 0)
    assert (cfg.client.lr, cfg.client.batch_size) == (w.lr, w.batch_size)
    assert (cfg.server.optimizer, cfg.server.server_lr) == ("fedavg", 1.0)
