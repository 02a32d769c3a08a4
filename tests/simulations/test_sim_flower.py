"""With workers and simulated dropouts on, the in-process engine and Flower agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate


@pytest.mark.flower
@pytest.mark.slow
def test_workers_and_dropouts_give_the_flower_model(tmp_path):
    common = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 8,
        "server.rounds": 3,
        "server.round_timeout": 2.0,
        "server.optimizer": "fedadam",
        "server.server_lr": 0.05,
        "client.momentum": 0.5,
        "simulation.workers": 2,
        "simulation.dropout": 0.25,
        "simulation.latency_median": 1.0,
    }
    a = load_config(None, {**common, "out": str(tmp_path / "a")})
    b = load_config(None, {**common, "out": str(tmp_path / "b"), "transport": "flower"})
    sa, sb = simulate(a), simulate(b)
    assert sa["workers"] == 2 and sb["transport"] == "flower"
    ma, mb = load_file(f"{a.out}/model.safetensors"), load_file(f"{b.out}/model.safetensors")
    for key in ma:
        torch.testing.assert_close(ma[key], mb[key], rtol=1e-5, atol=1e-6)
    rows = {
        k: [json.loads(x) for x in Path(c.out, "metrics.jsonl").read_text().splitlines()]
        for k, c in (("a", a), ("b", b))
    }
    for ra, rb in zip(rows["a"], rows["b"], strict=True):
        assert ra["cohort_aggregated"] == rb["cohort_aggregated"]
        assert (
            ra["sim_dropouts"] == rb["sim_dropouts"]
            and ra["sim_stragglers"] == rb["sim_stragglers"]
        )
    assert sum(r["dropped"] for r in rows["a"]) > 0
