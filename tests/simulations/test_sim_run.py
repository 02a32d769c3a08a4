"""`fedveil simulate` as a user sees it: progress, plots, big populations, local SGD."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from fedveil.benchmarks.bench_workload import Workload, bench_task
from fedveil.client.training import LocalTraining, _sgd_step
from fedveil.config import load_config
from fedveil.protocol.envelope import all_finite
from fedveil.server.engine.rounds import RoundEngine
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.plots import save_plots
from fedveil.simulations.simulate_run import simulate

PNG = b"\x89PNG\r\n\x1a\n"


def tiny_config(tmp_path, **extra):
    overrides = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 3,
        "out": str(tmp_path / "run"),
    }
    overrides.update(extra)
    return load_config(None, overrides)


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.procs)])
def test_progress_reports_clients_within_each_round(tmp_path, workers):
    seen: list[tuple[int, int]] = []
    rounds: list[int] = []
    cfg = tiny_config(tmp_path, **{"simulation.workers": workers})
    summary = simulate(cfg, on_round=lambda r: rounds.append(r.round), on_clients=_append(seen))
    assert summary["workers"] == workers
    assert rounds == [1, 2, 3]
    ends = [i for i, (done, total) in enumerate(seen) if done == total == 6]
    assert len(ends) == 3, "every round's exchange reports its end"
    assert seen[0] == (0, 6)
    dones = [done for done, _ in seen[: ends[0] + 1]]
    assert dones == sorted(dones)


def _append(seen):
    return lambda done, total: seen.append((done, total))


@pytest.mark.procs
def test_a_run_ends_with_plots_in_its_directory(tmp_path):
    cfg = tiny_config(tmp_path, **{"simulation.dropout": 0.2})
    summary = simulate(cfg)
    assert summary["plots"] == ["accuracy.png", "loss.png", "participation.png"]
    for name in summary["plots"]:
        data = (tmp_path / "run" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    # plots are not left over from an earlier run in the same directory
    simulate(tiny_config(tmp_path, **{"simulation.plots": False}))
    assert not (tmp_path / "run" / "accuracy.png").exists()


def test_epsilon_is_plotted_when_the_metrics_carry_it(tmp_path):
    rows = [
        {
            "round": r,
            "cohort_planned": 5,
            "cohort_aggregated": 5,
            "dropped": 0,
            "train_loss": 1.0 / r,
            "dp_epsilon": 0.3 * r,
        }
        for r in range(1, 6)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = [p.name for p in save_plots(tmp_path)]
    assert names == ["loss.png", "participation.png", "epsilon.png"]
    assert (tmp_path / "epsilon.png").read_bytes().startswith(PNG)


def test_a_population_of_100000_clients_runs_with_state_only_for_the_cohort():
    w = Workload(clients=100_000, per_round=8, rounds=2, examples=20, pool=500)
    cfg = load_config(
        None,
        {
            "data.num_clients": w.clients,
            "model.name": "mlp",
            "server.per_round": w.per_round,
            "server.rounds": 2,
            "eval.central_every": 0,
        },
    )
    task = bench_task(w)
    with InProcessTransport(task, workers=1) as transport:
        engine = RoundEngine(cfg, task, transport)
        engine.run()
        assert all(r.applied and r.cohort_aggregated == 8 for r in engine.history)
        assert len(transport.lane.states) <= w.per_round


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.0), (0.5, 0.01)])
def test_local_sgd_is_bitwise_torch_optim_sgd(momentum, weight_decay):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    b = copy.deepcopy(a)
    x, y = torch.randn(64, 20), torch.randint(0, 3, (64,))
    opt = torch.optim.SGD(a.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    hp = LocalTraining(lr=0.1, momentum=momentum, weight_decay=weight_decay)
    buffers: dict[int, torch.Tensor] = {}
    params = list(b.parameters())
    for step in range(6):
        batch = slice(8 * step, 8 * step + 16)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(a(x[batch]), y[batch]).backward()
        opt.step()
        for p in params:
            p.grad = None
        torch.nn.functional.cross_entropy(b(x[batch]), y[batch]).backward()
        _sgd_step(params, buffers, hp)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_finiteness_check_is_exact():
    assert all_finite(torch.randn(1000))
    big = torch.full((4,), 3e38)  # finite values whose sum overflows to inf
    assert all_finite(big)
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.randn(1000)
        t[517] = bad
        assert not all_finite(t)
    both = torch.tensor([float("inf"), -float("inf"), 1.0])
    assert not all_finite(both)
    assert all_finite(torch.empty(0))


@pytest.mark.procs
def test_tiny_task_metrics_match_with_workers_on(tmp_path):
    """The default (one worker per core) reaches the model one in-process lane reaches."""
    a = simulate(tiny_config(tmp_path, out=str(tmp_path / "a"), **{"simulation.workers": 1}))
    b = simulate(tiny_config(tmp_path, out=str(tmp_path / "b")))
    assert b["workers"] >= 1
    la = [json.loads(x)["test_loss"] for x in (tmp_path / "a" / "metrics.jsonl").open()]
    lb = [json.loads(x)["test_loss"] for x in (tmp_path / "b" / "metrics.jsonl").open()]
    assert la == lb
    assert a["test_accuracy"] == b["test_accuracy"]
    assert np.isfinite(la).all()
