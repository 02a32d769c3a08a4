"""Finite updates whose sum would overflow float32: under asynchronous training each
dispatch (one client in the clear) is summed again in the buffer of K, so two updates
of 2e38, each within float32, made the server update infinite and the model NaN for
the rest of the run, with every round reported applied. Each reply's bound now divides
by the dispatch's clients times K: the hostile clients are dropped by name and the run
goes on with the others."""

from __future__ import annotations

import json

import torch

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.inprocess import InProcessTransport

HOSTILE = (0, 1, 2, 3)


class HugeUpdates(InProcessTransport):
    """The in-process clients, with HOSTILE's updates replaced by 2e38 / weight."""

    def exchange(self, requests, timeout_s, on_reply=None):
        replies = super().exchange(requests, timeout_s)
        for cid, reply in replies.items():
            if cid in HOSTILE and isinstance(reply, Envelope) and reply.kind == "train":
                delta = torch.as_tensor(reply.arrays["delta"])
                reply.arrays["delta"] = torch.full_like(delta, 2e38 / reply.config["num_examples"])
        if on_reply is None:
            return replies
        for cid, reply in replies.items():
            on_reply(cid, reply)
        return {}


def test_async_buffer_of_finite_updates_never_makes_the_model_infinite(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 6,
            "server.per_round": 6,
            "server.rounds": 3,
            "server.mode": "async",
            "server.buffer": 2,
            "server.concurrency": 6,
            "simulation.workers": 1,
            "out": str(tmp_path / "run"),
        },
    )
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    engine = RunLifecycle(cfg, task, store).engine(HugeUpdates(task))
    summary = engine.run()
    assert bool(torch.isfinite(engine.weights).all())
    assert summary["rounds_applied"] == 3
    assert summary["client_errors"].get("update overflows the sum", 0) >= 4, summary
    records = [json.loads(line) for line in store.metrics_path.read_text().splitlines()]
    assert all(r["applied"] for r in records)
