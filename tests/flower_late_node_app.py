"""A Flower ServerApp as a user writes it with fedveil's secure(): Flower's FedAvg with its
defaults (min_available_nodes = 2), one round, for tests/engine/test_flower_secagg_late_node.py.

It records how many nodes FedAvg sampled, then touches `result`.sampled (the test starts
the late SuperNode only then), and writes what secure() did to `result` (run config)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import flower_quickstart_app as quickstart
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.server import Grid
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg

from fedveil.flower import SecureAggregationRefused, secure

app = ServerApp()


class SampledFedAvg(FedAvg):
    """FedAvg, noting how many nodes its own sampling chose (and when)."""

    def __init__(self, marker: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker, self.sampled = marker, 0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.sampled = len(messages)
        self.marker.touch()
        return messages


@app.main()
def main(grid: Grid, context: Context) -> None:
    result = Path(str(context.run_config["result"]))
    strategy = SampledFedAvg(result.with_suffix(".sampled"), fraction_evaluate=0.0)
    torch.manual_seed(0)
    wrapped = secure(grid, strategy, node_wait_s=float(context.run_config["node-wait-s"]))
    out: dict[str, Any] = {}
    try:
        strategy.start(
            grid=wrapped, initial_arrays=ArrayRecord(quickstart.Net().state_dict()), num_rounds=1
        )
    except SecureAggregationRefused as exc:
        out["error"] = str(exc)
    out.update(sampled=strategy.sampled, rounds=wrapped.rounds)
    result.write_text(json.dumps(out))
