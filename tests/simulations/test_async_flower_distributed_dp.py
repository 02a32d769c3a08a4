"""Distributed DP in asynchronous secure-aggregation groups on Flower's simulation engine:
the clients on Ray compute the group plan from the run config they hold, each group is
charged before it is unmasked, and the ledger verifies to the P-fold bound (issue 21)."""

from __future__ import annotations

from collections import Counter

import pytest

from fedveil.config import load_config
from fedveil.privacy.dp import Ledger
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.simulate_run import simulate


@pytest.mark.flower
@pytest.mark.slow
def test_async_distributed_dp_groups_on_flower(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.mode": "async",
            "server.buffer": 3,
            "server.group_size": 3,
            "server.rounds": 3,
            "server.max_participations": 2,
            "secagg.enabled": True,
            "dp.mechanism": "distributed",
            "dp.epsilon": 8.0,
            "dp.clip": 0.5,
            "simulation.latency_median": 1.0,
            "simulation.latency_sigma": 1.0,
            "simulation.plots": False,
            "transport": "flower",
            "out": str(tmp_path / "run"),
        },
    )
    summary = simulate(cfg)
    assert summary["transport"] == "flower" and summary["rounds"] == 3
    assert summary["dp"] == "distributed_skellam" and summary["max_participations"] == 2
    store = RunStore(cfg.out)
    result = verify_ledger(store.ledger_path)
    assert result.ok, result.message
    assert result.final_epsilon == pytest.approx(summary["epsilon_cap_bound"], rel=1e-12)
    releases = Ledger(store.ledger_path).releases
    assert len(releases) >= 3 and {e["noise_shares"] for e in releases} == {1}
    private = store.read_private()
    charges = [r for r in private if r.get("kind") == "charge"]
    assert len(charges) == len(releases)
    charged = Counter(c for r in charges for c in r["survivors"])
    assert max(charged.values()) <= 2
