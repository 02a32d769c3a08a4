"""Asynchronous training on Flower's simulation engine reaches the in-process model:
arrivals follow the simulated clock, never the order Ray returns replies in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedveil.config import load_config
from fedveil.simulations.run import simulate


@pytest.mark.flower
@pytest.mark.slow
def test_async_inprocess_and_flower_give_the_same_model(tmp_path):
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
    }
    a = load_config(None, {**common, "out": str(tmp_path / "a")})
    b = load_config(None, {**common, "out": str(tmp_path / "b"), "transport": "flower"})
    sa, sb = simulate(a), simulate(b)
    assert sb["transport"] == "flower" and sa["mode"] == sb["mode"] == "async"
    ma, mb = load_file(f"{a.out}/model.safetensors"), load_file(f"{b.out}/model.safetensors")
    for key in ma:
        torch.testing.assert_close(ma[key], mb[key], rtol=1e-5, atol=1e-6)
    rows = {
        k: [json.loads(x) for x in Path(c.out, "metrics.jsonl").read_text().splitlines()]
        for k, c in (("a", a), ("b", b))
    }
    for ra, rb in zip(rows["a"], rows["b"], strict=True):
        for key in ("applied_dispatches", "staleness", "dropped", "sim_clock_s"):
            assert ra[key] == rb[key], key
    assert sum(r["dropped"] for r in rows["a"]) > 0
