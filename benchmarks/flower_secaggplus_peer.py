"""The secure-aggregation benchmark's peer: Flower 1.41's SecAgg+ on its legacy compat path.

What a Flower user runs for secure aggregation: a ServerApp whose main wraps the context in
a `LegacyContext` with `flwr.server.strategy.FedAvg` and runs `DefaultWorkflow`, with
`SecAggPlusWorkflow(num_shares=k + 1, reconstruction_threshold=t)` as its fit workflow (or
the default fit workflow for the plain round), and a ClientApp of a `NumPyClient` behind
`flwr.client.mod.secaggplus_mod`. Flower counts shares including the client's own, and builds
its ring with num_shares // 2 neighbours on each side, so k + 1 shares (k even, or the
complete graph) gives exactly our k neighbours.

Clients train the benchmark's workload exactly as fedveil's runtime does (same initial
model, data, generator, one SGD step). The chosen clients raise in a mod in front of
`secaggplus_mod` when the chosen stage's message arrives (any training message in the plain
round). Round times are the gaps between FedAvg's `evaluate` calls, which DefaultWorkflow
makes after initialisation and after every round; bytes are counted on the Grid.
"""

from __future__ import annotations

import io
import logging
import math
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from fedveil.benchmarks.secagg_round_workload import (
    CLIP_RANGE,
    DROP_MARKER,
    DROP_STAGES,
    LEVELS,
    LR,
    ClientDropped,
    Traffic,
    Workload,
    steady_rounds,
)
from fedveil.client.runtime import client_generator
from fedveil.client.training import LocalTraining, train_local
from fedveil.flat_model import FlatModel
from fedveil.privacy.secagg.wire import wire_size
from fedveil.server.engine.rounds import initial_model


def array_nbytes(array: Any) -> int:
    """Raw data bytes of a Flower Array, like `wire_size` counts arrays. Arrays converted from
    legacy `Parameters` carry no dtype or shape, only .npy bytes: read their header."""
    if array.dtype:
        return math.prod(array.shape) * np.dtype(array.dtype).itemsize
    stream = io.BytesIO(array.data)
    major, _ = np.lib.format.read_magic(stream)
    read_header = (
        np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read_header(stream)
    return math.prod(shape) * dtype.itemsize


def content_size(content: Any) -> int:
    """Payload bytes of a Flower RecordDict, by `wire_size`'s rules."""
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

    # Records by iteration, not through RecordDict's typed views, which rebuild a dict per
    # access: this runs in the round loop, so it must not slow the peer's round down.
    total = 0
    for record in content.values():
        if isinstance(record, (ConfigRecord, MetricRecord)):
            total += wire_size(dict(record), {})
        elif isinstance(record, ArrayRecord):
            total += sum(len(k) + array_nbytes(a) for k, a in record.items())
    return total


def _kind(message: Any) -> str:
    """The SecAgg+ stage a message starts, or its message type."""
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    record = message.content.get(RECORD_KEY_CONFIGS)
    if record is not None and Key.STAGE in record:
        return f"secagg+.{record[Key.STAGE]}"
    return str(message.metadata.message_type)


class CountingGrid:
    """A Grid that counts payload bytes per node and round (the message's group id)."""

    def __init__(self, grid: Any, counter: Traffic) -> None:
        self._grid, self.counter = grid, counter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(
        self, messages: Iterable[Any], *, timeout: float | None = None
    ) -> Iterable[Any]:
        c = self.counter
        messages = list(messages)
        for m in messages:
            c.add(c.down, int(m.metadata.group_id), m.metadata.dst_node_id, content_size(m.content))
        started = time.perf_counter()
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        if messages:
            c.timed(
                int(messages[0].metadata.group_id),
                _kind(messages[0]),
                time.perf_counter() - started,
            )
        for r in replies:
            rnd, node = int(r.metadata.group_id), r.metadata.src_node_id
            if r.has_error():
                c.failed[rnd].add(node)
            else:
                c.add(c.up, rnd, node, content_size(r.content))
        return replies


class DropMod:
    """Makes the workload's failing clients raise at the chosen SecAgg+ stage."""

    def __init__(self, workload: Workload, secagg: bool) -> None:
        self.dropped = workload.dropped
        self.stage = DROP_STAGES[workload.drop_stage][1] if secagg else None

    def __call__(self, msg: Any, ctxt: Any, call_next: Any) -> Any:
        from flwr.app.message_type import MessageType
        from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

        cid = int(ctxt.node_config["partition-id"])
        if cid in self.dropped and msg.metadata.message_type == MessageType.TRAIN:
            record = msg.content.get(RECORD_KEY_CONFIGS)
            stage = None if record is None else record.get(Key.STAGE)
            if stage == self.stage:
                raise ClientDropped(f"{DROP_MARKER} client {cid} drops at {stage or 'fit'}")
        return call_next(msg, ctxt)


_MODELS: dict[Workload, tuple[Any, FlatModel]] = {}  # one task and model per Ray worker


def _task_and_model(w: Workload) -> tuple[Any, FlatModel]:
    if w not in _MODELS:
        task = w.task()
        _MODELS[w] = (task, FlatModel(task.model_fn(), "cpu"))
    return _MODELS[w]


def flat_to_ndarrays(model: FlatModel, flat: np.ndarray) -> list[np.ndarray]:
    return [
        np.ascontiguousarray(flat[e.offset : e.offset + e.numel].reshape(e.shape))
        for e in model.entries
    ]


def make_client_app(w: Workload, secagg: bool) -> Any:
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod

    class BenchClient(NumPyClient):
        def __init__(self, cid: int) -> None:
            self.cid = cid

        def fit(
            self, parameters: list[np.ndarray], config: dict[str, Any]
        ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
            # The same local step as fedveil's ClientRuntime on the same data.
            task, model = _task_and_model(w)
            flat = np.concatenate([p.ravel() for p in parameters]).astype(np.float32)
            data = task.client_data(self.cid)
            hp = LocalTraining(local_epochs=1, batch_size=w.examples, lr=LR)
            gen = client_generator(w.seed, int(config["round"]), self.cid)
            result = train_local(
                model, torch.from_numpy(flat), data.x, data.y, hp, task.loss_fn, gen
            )
            new = flat + result.delta.numpy()
            return flat_to_ndarrays(model, new), result.num_examples, {}

    def client_fn(context: Any) -> Any:
        return BenchClient(int(context.node_config["partition-id"])).to_client()

    mods = [DropMod(w, secagg), secaggplus_mod] if secagg else [DropMod(w, secagg)]
    return ClientApp(client_fn=client_fn, mods=mods)


def make_server_app(
    w: Workload, secagg: bool, k: int, t: int, rounds: int, result: dict[str, Any]
) -> Any:
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    task = w.task()
    init = FlatModel(initial_model(task, w.seed)).get().numpy().astype(np.float32)
    shapes_model = FlatModel(task.model_fn())
    stamps: list[float] = []
    first: dict[str, Any] = {}

    class TimedFedAvg(FedAvg):
        """FedAvg that stamps every evaluate call and keeps round 1's aggregate."""

        def evaluate(self, server_round: int, parameters: Any) -> None:
            stamps.append(time.perf_counter())
            return None

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            params, metrics = super().aggregate_fit(server_round, results, failures)
            if server_round == 1 and params is not None:
                flat = np.concatenate([a.ravel() for a in parameters_to_ndarrays(params)])
                first["mean"] = flat.astype(np.float64) - init.astype(np.float64)
                first["results"] = len(results)
            return params, metrics

    strategy = TimedFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=w.clients,
        min_evaluate_clients=0,
        min_available_clients=w.clients,
        accept_failures=True,
        initial_parameters=ndarrays_to_parameters(flat_to_ndarrays(shapes_model, init)),
        on_fit_config_fn=lambda rnd: {"round": rnd},
    )
    counter = Traffic()
    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        legacy = LegacyContext(
            context=context, config=ServerConfig(num_rounds=rounds), strategy=strategy
        )
        fit_workflow = (
            SecAggPlusWorkflow(
                num_shares=k + 1,  # k neighbours + the client itself
                reconstruction_threshold=t,
                max_weight=float(w.examples),
                clipping_range=CLIP_RANGE,
                quantization_range=LEVELS,
            )
            if secagg
            else None
        )
        DefaultWorkflow(fit_workflow=fit_workflow)(CountingGrid(grid, counter), legacy)
        result["stamps"] = list(stamps)
        result["first"] = first
        result["counter"] = counter

    return app


def simulate_apps(server_app: Any, client_app: Any, supernodes: int) -> None:
    """Flower's simulation engine as every contender here runs it: the backend configuration
    fedveil's run_on_flower uses (one CPU per client), Flower's logs quiet."""
    from flwr.simulation import run_simulation

    backend_config = {
        "client_resources": {"num_cpus": 1.0, "num_gpus": 0.0},
        "init_args": {"log_to_driver": False, "logging_level": "error"},
    }
    logging.getLogger("flwr").setLevel(logging.ERROR)
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=supernodes,
        backend_config=backend_config,
    )


def run_flower(w: Workload, secagg: bool, k: int, t: int, rounds: int) -> dict[str, Any]:
    """R rounds of Flower's DefaultWorkflow, with or without SecAggPlusWorkflow."""
    result: dict[str, Any] = {}
    started = time.perf_counter()
    simulate_apps(
        make_server_app(w, secagg, k, t, rounds, result), make_client_app(w, secagg), w.clients
    )
    wall = time.perf_counter() - started
    stamps = result.get("stamps", [])
    if len(stamps) != rounds + 1:
        raise RuntimeError(
            f"Flower {'SecAgg+' if secagg else 'plain'} run ended after {len(stamps) - 1} "
            f"of {rounds} rounds (see the log above)"
        )
    first = result["first"]
    counter: Traffic = result["counter"]
    return {
        "framework": "flower",
        "secagg": secagg,
        "round_s": list(np.diff(stamps)),
        "wall_s": wall,
        **counter.per_client(steady_rounds(rounds)),
        "exchange_s": counter.exchanges(steady_rounds(rounds)),
        "outside_exchanges_s": counter.outside(list(np.diff(stamps))),
        "_mean": first.get("mean"),
        "_contributors": first.get("results", 0),
    }


__all__ = ["content_size", "run_flower"]
