"""Federated evaluation replies are a client's claims: each is checked (kind, round,
num_examples in [1, 10^7], accuracy in [0, 1], loss finite and >= 0), and a reply that
fails is left out with a warning naming the check. Before, a string or NaN count or a
missing loss crashed the round (the whole run), and an accuracy of 1e9 or a count of
10^12 went into the record."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping

import pytest

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.inprocess import InProcessTransport

HOSTILE = 0  # the one client whose evaluation replies are replaced


class LyingEvaluator(InProcessTransport):
    """The in-process clients, with client HOSTILE's evaluation reply replaced by `lie`."""

    def __init__(self, task, lie: Mapping) -> None:
        super().__init__(task)
        self.lie = lie

    def exchange(self, requests, timeout_s, on_reply=None):
        replies = super().exchange(requests, timeout_s, on_reply)
        for cid, request in requests.items():
            if cid == HOSTILE and request.kind == Kind.EVALUATE:
                replies[cid] = Envelope(
                    self.lie.get("kind", Kind.EVALUATE),
                    request.round + self.lie.get("round_offset", 0),
                    dict(self.lie["config"]),
                )
        return replies


@pytest.mark.parametrize(
    ("config", "extra", "named"),
    [
        ({"num_examples": "many", "loss": 1.0, "accuracy": 0.5}, {}, "num_examples = 'many'"),
        ({"num_examples": math.nan, "loss": 1.0, "accuracy": 0.5}, {}, "num_examples = nan"),
        ({"num_examples": 10, "accuracy": 0.5}, {}, "accuracy/loss missing"),
        ({"num_examples": 10, "loss": 1.0, "accuracy": 1e9}, {}, "accuracy = 1000000000.0"),
        ({"num_examples": 10, "loss": math.inf, "accuracy": 0.5}, {}, "loss = inf"),
        (
            {"num_examples": 10**12, "loss": 0.0, "accuracy": 1.0},
            {},
            "must be an integer in [1, 10000000]",
        ),
        ({"num_examples": 10, "loss": 0.0, "accuracy": 1.0}, {"round_offset": 1}, "is for round"),
        ({"num_examples": 10, "loss": 0.0, "accuracy": 1.0}, {"kind": Kind.TRAIN}, "expected an"),
    ],
)
def test_a_lying_evaluation_reply_is_left_out_naming_the_check(
    tmp_path, caplog, config, extra, named
):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 4,
        "server.per_round": 4,
        "server.rounds": 2,
        "eval.federated_every": 1,
        "eval.federated_clients": 4,
        "eval.client_holdout": 0.25,
        "simulation.workers": 1,
        "out": str(tmp_path / "run"),
    }
    cfg = load_config(None, values)
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    transport = LyingEvaluator(task, {"config": config, **extra})
    with caplog.at_level(logging.WARNING, logger="fedveil"):
        summary = RunLifecycle(cfg, task, store).engine(transport).run()
    assert summary["rounds_applied"] == 2
    metrics = [json.loads(line) for line in store.metrics_path.read_text().splitlines()]
    for m in metrics:
        assert 0.0 <= m["federated_accuracy"] <= 1.0, m
        assert 0.0 <= m["federated_loss"] < math.inf, m
    warned = [r.getMessage() for r in caplog.records if "federated evaluation" in r.getMessage()]
    assert len(warned) == 2 and all(named in w for w in warned), warned
