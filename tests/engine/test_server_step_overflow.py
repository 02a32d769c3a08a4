"""A server update that is not finite is never applied. Each reply is bounded so that the
sum stays finite (test_update_overflow.py), but the server's learning rate (up to 100)
can carry a bounded mean past float32: with server_lr = 100 an update of 3e38 / its
weight made the model infinite, and every later round's clients' updates NaN. Now that
round is not applied (logged), the model and the optimizer's state are kept, and the
honest rounds go on."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.inprocess import InProcessTransport

HOSTILE = 0
HOSTILE_ROUNDS = (2,)


class HugeInRound(InProcessTransport):
    """The in-process client; its update in HOSTILE_ROUNDS is 3e38 / weight (within the
    bound: weighted, 3e38 <= float32's largest)."""

    def exchange(self, requests, timeout_s, on_reply=None):
        replies = super().exchange(requests, timeout_s)
        reply = replies.get(HOSTILE)
        if isinstance(reply, Envelope) and reply.kind == "train" and reply.round in HOSTILE_ROUNDS:
            delta = torch.as_tensor(reply.arrays["delta"])
            reply.arrays["delta"] = torch.full_like(delta, 3e38 / reply.config["num_examples"])
        if on_reply is None:
            return replies
        for cid, r in replies.items():
            on_reply(cid, r)
        return {}


@pytest.mark.parametrize("optimizer", ["fedavg", "fedavgm", "fedadam"])
def test_a_server_update_that_is_not_finite_is_not_applied(tmp_path, caplog, optimizer):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 1,  # the hostile client's update is the round's mean
            "server.per_round": 1,
            "server.rounds": 3,
            "server.server_lr": 100.0,
            "server.optimizer": optimizer,
            "simulation.workers": 1,
            "out": str(tmp_path / "run"),
        },
    )
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    engine = RunLifecycle(cfg, task, store).engine(HugeInRound(task))
    with caplog.at_level(logging.ERROR, logger="fedveil"):
        engine.run()
    assert bool(torch.isfinite(engine.weights).all())
    assert all(bool(torch.isfinite(t).all()) for t in engine.optimizer.state_dict().values())
    records = [json.loads(line) for line in store.metrics_path.read_text().splitlines()]
    assert [r["applied"] for r in records] == [True, False, True], records
    assert "round 2: the server update is not finite" in caplog.text
