"""Round overhead of secure aggregation for a Flower app: fedveil's against Flower's SecAgg+.

Ours: a Flower Message-API ServerApp running `flwr.serverapp.strategy.FedAvg` with
`strategy.start(grid=fedveil.flower.secure(grid, strategy), ...)` and a ClientApp with
`fedveil_secagg_mod` (fedveil.server.engine.flower_secagg). The peer: Flower's SecAgg+
on its legacy path (`SecAggPlusWorkflow` + `secaggplus_mod`, benchmarks/
flower_secaggplus_peer.py, as `fedveil bench secagg --peer flower` runs it). Each side
runs the same workload (bench_secagg_round.Workload: same model, data and local step)
plain and secure on Flower's simulation engine, with the same k, t, clip range, levels
and max weight; the overhead is the secure round's time minus the plain round's
(medians of the steady rounds), and the ratio is Flower's overhead over ours.

No dropouts: our key stages are not pipelined on this path (each strategy round is its
own exchange), so a secure round is four exchanges, as Flower's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedveil.benchmarks.bench_secagg_round import steady
from fedveil.benchmarks.flower_secaggplus_peer import (
    _task_and_model,
    flat_to_ndarrays,
    run_flower,
    simulate_apps,
)
from fedveil.benchmarks.harness import command_main, print_report
from fedveil.benchmarks.secagg_round_workload import (
    CLIP_RANGE,
    LEVELS,
    LR,
    Workload,
    graph_parameters,
)
from fedveil.client.runtime import client_generator
from fedveil.client.training import LocalTraining, train_local
from fedveil.flat_model import FlatModel
from fedveil.server.engine.rounds import initial_model

TARGET_RATIO = 5.0  # issue 19: our overhead at least 5x smaller than Flower's


def make_client_app(w: Workload, secure: bool) -> Any:
    """A Message-API ClientApp training the workload as the peer's NumPyClient does."""
    from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fedveil.client.flower_secagg_mod import fedveil_secagg_mod

    app = ClientApp(mods=[fedveil_secagg_mod] if secure else [])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        task, model = _task_and_model(w)
        arrays = msg.content["arrays"]
        flat = np.concatenate([a.numpy().ravel() for a in arrays.values()]).astype(np.float32)
        data = task.client_data(cid)
        hp = LocalTraining(local_epochs=1, batch_size=w.examples, lr=LR)
        gen = client_generator(w.seed, int(msg.content["config"]["server-round"]), cid)
        result = train_local(model, torch.from_numpy(flat), data.x, data.y, hp, task.loss_fn, gen)
        new = flat_to_ndarrays(model, flat + result.delta.numpy())
        out = ArrayRecord({k: Array(v) for k, v in zip(arrays.keys(), new, strict=True)})
        metrics = MetricRecord({"num-examples": int(result.num_examples)})
        return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)

    return app


def make_server_app(
    w: Workload, secure: bool, k: int, t: int, rounds: int, result: dict[str, Any]
) -> Any:
    """FedAvg (Message API) over every client; round times from evaluate_fn's stamps."""
    from flwr.app import Array, ArrayRecord
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg

    from fedveil.server.engine.flower_secagg import secure as secure_grid

    task = w.task()
    init = FlatModel(initial_model(task, w.seed)).get().numpy().astype(np.float32)
    shapes = FlatModel(task.model_fn())
    initial = ArrayRecord(
        {
            e.name: Array(a)
            for e, a in zip(shapes.entries, flat_to_ndarrays(shapes, init), strict=True)
        }
    )
    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        stamps: list[float] = []

        def evaluate_fn(server_round: int, arrays: Any) -> None:
            stamps.append(time.perf_counter())
            return None

        # min_train_nodes: every node, even if some connect after round 1 is configured.
        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=w.clients,
            min_available_nodes=w.clients,
        )
        if secure:
            grid = secure_grid(
                grid,
                strategy,
                clip_range=CLIP_RANGE,
                levels=LEVELS,
                max_weight=w.examples,
                neighbors=k,
                threshold=t,
                train_metrics=(),
                evaluate_metrics=(),
            )
        final = strategy.start(
            grid=grid, initial_arrays=initial, num_rounds=rounds, evaluate_fn=evaluate_fn
        )
        result["stamps"] = stamps
        result["final"] = np.concatenate([a.numpy().ravel() for a in final.arrays.values()])

    return app


def run_ours(w: Workload, secure: bool, k: int, t: int, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    started = time.perf_counter()
    simulate_apps(
        make_server_app(w, secure, k, t, rounds, result), make_client_app(w, secure), w.clients
    )
    stamps = result.get("stamps", [])
    if len(stamps) != rounds + 1:
        raise RuntimeError(f"our {'secure' if secure else 'plain'} run ended early (see log)")
    return {
        "framework": "fedveil",
        "secagg": secure,
        "round_s": list(np.diff(stamps)),
        "wall_s": time.perf_counter() - started,
        "_final": result["final"],
    }


def bench(w: Workload, rounds: int, repeat: int, k: int, t: int) -> dict[str, Any]:
    """Every configuration `repeat` times, interleaved; steady-round medians."""
    runs: dict[str, list[dict[str, Any]]] = {
        "ours_plain": [],
        "ours_secure": [],
        "flower_plain": [],
        "flower_secure": [],
    }
    for _ in range(repeat):
        runs["ours_plain"].append(run_ours(w, False, k, t, rounds))
        runs["ours_secure"].append(run_ours(w, True, k, t, rounds))
        runs["flower_plain"].append(run_flower(w, False, k, t, rounds))
        runs["flower_secure"].append(run_flower(w, True, k, t, rounds))
    medians = {name: steady(r) for name, r in runs.items()}
    ours = _minus(medians["ours_secure"], medians["ours_plain"])
    flower = _minus(medians["flower_secure"], medians["flower_plain"])
    ratio = flower / ours if ours and flower is not None and ours > 0 else None
    gap = float(np.abs(runs["ours_secure"][0]["_final"] - runs["ours_plain"][0]["_final"]).max())
    return {
        "clients": w.clients,
        "dim": w.num_params,
        "rounds": rounds,
        "repeat": repeat,
        "neighbors": k,
        "threshold": t,
        "round_s": medians,
        "overhead_s": {"fedveil": ours, "flower": flower},
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio is not None and ratio >= TARGET_RATIO,
        "secure_vs_plain_max_diff": gap,
        "cpu_count": os.cpu_count(),
        "load_avg": list(os.getloadavg()),
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def format_report(out: dict[str, Any]) -> str:
    def s(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f} s"

    m, o = out["round_s"], out["overhead_s"]
    lines = [
        f"Secure aggregation for a Flower FedAvg app: n = {out['clients']}, "
        f"d = {out['dim']}, k = {out['neighbors']}, t = {out['threshold']}, "
        f"rounds = {out['rounds']} x {out['repeat']} (steady-round medians)",
        f"{'':28}{'fedveil (Message API)':>24}{'Flower SecAgg+ (legacy)':>26}",
        f"{'plain round':28}{s(m['ours_plain']):>24}{s(m['flower_plain']):>26}",
        f"{'secure round':28}{s(m['ours_secure']):>24}{s(m['flower_secure']):>26}",
        f"{'overhead (secure - plain)':28}{s(o['fedveil']):>24}{s(o['flower']):>26}",
        "overhead ratio (Flower / fedveil): "
        + ("n/a" if out["ratio"] is None else f"{out['ratio']:.1f}x")
        + f" (target >= {out['target_ratio']:.0f}x: "
        + ("met" if out["meets_target"] else "NOT met")
        + ")",
        f"secure vs plain final model, max |diff|: {out['secure_vs_plain_max_diff']:.2e} "
        "(quantisation)",
        f"machine: {out['cpu_count']} cores, load average {out['load_avg'][0]:.1f}",
    ]
    return "\n".join(lines)


FLOWER_SECAGG_SUMMARY = (
    "`fedveil bench flower-secagg`: a Flower Message-API FedAvg app run plain and with "
    "fedveil.flower.secure (fedveil_secagg_mod on the clients), against Flower's SecAgg+ "
    "on its legacy path run plain and secure, on Flower's simulation engine with the same "
    "workload, k, t and quantisation; prints each side's round overhead (secure minus plain "
    "round, steady-round medians) and their ratio. --json prints one JSON object as the "
    "last line of stdout."
)


def add_flower_secagg_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench flower-secagg`."""
    p.add_argument("--clients", type=int, default=100, help="clients, all sampled [100]")
    p.add_argument("--dim", type=int, default=100_000, help="model parameters [100000]")
    p.add_argument("--rounds", type=int, default=4, help="rounds; first and last excluded [4]")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration [1]")
    p.add_argument("--neighbors", type=int, help="neighbours k [from the threat model]")
    p.add_argument("--threshold", type=int, help="Shamir threshold t [from the threat model]")
    p.add_argument("--examples", type=int, default=8, help="most examples per client [8]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_flower_secagg(args: argparse.Namespace) -> int:
    for name in ("clients", "dim", "rounds", "repeat", "examples"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} = {getattr(args, name)}: must be >= 1")
    w = Workload(
        clients=args.clients, dim=args.dim, dropout=0.0, examples=args.examples, seed=args.seed
    )
    k, t = graph_parameters(w, args.neighbors, args.threshold)
    out = bench(w, args.rounds, args.repeat, k, t)
    print_report(out, format_report(out), args.json)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_flower_strategy_secagg`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_flower_strategy_secagg",
        description=FLOWER_SECAGG_SUMMARY,
        add_arguments=add_flower_secagg_arguments,
        run=cmd_bench_flower_secagg,
    )


if __name__ == "__main__":
    sys.exit(main())
