"""Gossip as 4 processes over torch.distributed (gloo send/recv) equals the in-process run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedveil.config import load_config
from fedveil.simulations.gossip.distributed import run_gossip_processes
from fedveil.simulations.gossip.engine import GossipEngine
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.tasks import make_task


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_four_gloo_processes_match_the_in_process_run(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 8,
            "server.rounds": 2,
            "server.aggregation": "gossip",
            "gossip.topology": "exponential",
            "simulation.workers": 1,
        },
    )
    files = run_gossip_processes(cfg, 4, tmp_path)
    task = make_task(cfg)
    with InProcessTransport(task, "cpu", workers=1, unit_size=32, run_config=cfg) as transport:
        engine = GossipEngine(cfg, task, transport)
        engine.run()
    parts = [torch.load(f) for f in files]
    assert sorted(c for p in parts for c in p["clients"]) == list(range(8))
    scale = float(engine.x.abs().max())
    for part in parts:
        assert part["failures"] == []
        assert part["bytes_sent"] > 0  # the rows did travel between the processes
        torch.testing.assert_close(
            part["rows"], engine.x[part["clients"]], rtol=0, atol=1e-5 * scale
        )
        torch.testing.assert_close(part["consensus"], engine.consensus(), rtol=0, atol=1e-5 * scale)
    # Not trivially equal: the clients' models differ after two rounds on a sparse graph.
    assert float((engine.x - engine.consensus()).abs().max()) > 1e-3 * scale
