"""Asynchronous training on Flower's simulation engine reaches the in-process model:
arrivals follow the simulated clock, never the order Ray returns replies in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate

# Secure aggregation in groups of 3: keys agreed ahead and members freed once they have
# sent their masked input, on both transports' simulated clock. Four slots (C = 12), so a
# group's keys are agreed several dispatches before it trains, and the in-process side on
# a worker pool that evaluates centrally between (sessions must stay on their worker).
SECAGG_GROUPS = {
    "secagg.enabled": True,
    "data.num_clients": 24,
    "server.concurrency": 12,
    "simulation.workers": 2,
    "server.group_size": 3,
    "server.buffer": 3,
    "simulation.dropout": 0.0,
    "simulation.message_latency_share": 0.1,
}


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, SECAGG_GROUPS], ids=["clear", "secagg-groups"])
def test_async_inprocess_and_flower_give_the_same_model(tmp_path, extra):
    common = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.mode": "async",
        "server.buffer": 2,
        "server.rounds": 5,
        "server.optimizer": "fedadam",
        "server.server_lr": 0.05,
        "simulation.vmap_clients": 1,
        "simulation.dropout": 0.2,
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "simulation.plots": False,
        **extra,
    }
    a = load_config(None, {**common, "out": str(tmp_path / "a")})
    b = load_config(None, {**common, "out": str(tmp_path / "b"), "transport": "flower"})
    sa, sb = simulate(a), simulate(b)
    assert sb["transport"] == "flower" and sa["mode"] == sb["mode"] == "async"
    ma, mb = load_file(f"{a.out}/model.safetensors"), load_file(f"{b.out}/model.safetensors")
    # Secure aggregation's stochastic rounding draws OS randomness on each transport:
    # equal to the quantizer's error there, to float noise in the clear.
    atol, rtol = (2e-3, 0.0) if extra else (1e-6, 1e-5)
    for key in ma:
        torch.testing.assert_close(ma[key], mb[key], rtol=rtol, atol=atol)
    rows = {
        k: [json.loads(x) for x in Path(c.out, "metrics.jsonl").read_text().splitlines()]
        for k, c in (("a", a), ("b", b))
    }
    for ra, rb in zip(rows["a"], rows["b"], strict=True):
        for key in ("applied_dispatches", "staleness", "dropped", "sim_clock_s"):
            assert ra[key] == rb[key], key
    if not extra:
        assert sum(r["dropped"] for r in rows["a"]) > 0
