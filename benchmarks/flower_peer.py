"""The benchmark's peer: the same workload as a canonical Flower 1.41 Message-API app.

A ServerApp running `flwr.serverapp.strategy.FedAvg`, a ClientApp training the
same MLP on the same generated examples, started with
`flwr.simulation.run_simulation` (Ray): what a Flower user would run.
Round times come from FedAvg's `evaluate_fn` hook, which Flower calls before
the first round and after every round.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from fedveil.benchmarks.bench_workload import SyntheticPool, Workload, local_epoch, mlp
from fedveil.benchmarks.memwatch import RoundClock

_POOL: dict[Workload, SyntheticPool] = {}  # one generated pool per Ray worker process


def _pool(w: Workload) -> SyntheticPool:
    if w not in _POOL:
        _POOL[w] = SyntheticPool(w)
    return _POOL[w]


def make_apps(w: Workload, clock: RoundClock, losses: list[float]) -> tuple[Any, Any]:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.server import Grid
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        round_num = int(msg.content["config"]["server-round"])
        model = mlp()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        data = _pool(w)(cid)
        gen = torch.Generator().manual_seed(w.seed * 7919 + round_num * 1_000_003 + cid)
        loss = local_epoch(model, data.x, data.y, w, gen)
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"train_loss": loss, "num-examples": len(data)}),
            }
        )
        return Message(content=content, reply_to=msg)

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.manual_seed(w.seed)
        strategy = FedAvg(
            fraction_train=w.per_round / w.clients,
            fraction_evaluate=0.0,
            min_train_nodes=w.per_round,
            min_available_nodes=w.clients,
        )

        def timer(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            clock.mark()
            return None

        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(mlp().state_dict()),
            num_rounds=w.rounds,
            train_config=ConfigRecord({"lr": w.lr}),
            evaluate_fn=timer,
        )
        for r in sorted(result.train_metrics_clientapp):
            losses.append(float(result.train_metrics_clientapp[r]["train_loss"]))

    return server_app, client_app


def run_flower(w: Workload, num_cpus_per_client: float = 1.0) -> dict[str, Any]:
    """Run the workload on Flower's simulation engine; per-round times from FedAvg's hook."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # offline machine: no phoning home
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.ERROR)
    clock = RoundClock()
    losses: list[float] = []
    server_app, client_app = make_apps(w, clock, losses)
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=w.clients,
        backend_config={
            "client_resources": {"num_cpus": num_cpus_per_client, "num_gpus": 0.0},
            "init_args": {"log_to_driver": False, "logging_level": "error"},
        },
    )
    if len(clock.at) != w.rounds + 1:
        raise RuntimeError(f"Flower ran {max(len(clock.at) - 1, 0)} of {w.rounds} rounds")
    return {**clock.result(), "train_loss": losses}
