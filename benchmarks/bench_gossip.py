"""The gossip half of `fedveil bench decentral` (--part gossip): gossip training against
FedAvg at equal client updates (issue 34).

Three contenders train the same job (Fashion-MNIST, 100 clients, Dirichlet(0.5), one
local epoch; `--model`, default mlp: see below) with the same budget of client updates
(local trainings, the training compute), one after another in this process:

- fedavg: the coordinator round, 20 clients per round (`fedveil simulate`'s default);
- gossip_ring: randomized gossip (gossip.active, default 20 = FedAvg's cohort: equal
  client updates a round): the awake clients train, then mix with their 2 ring
  neighbours (Metropolis-Hastings over the edges touching them); --active 0: every
  client every round (synchronous D-PSGD);
- gossip_exponential: the same on the exponential graph (neighbours at +-2^k).

--gossip-momentum B (default 0.7) gives both gossip contenders quasi-global momentum
(gossip.momentum, QG-DSGDm); FedAvg keeps its dataset default, server momentum 0.7
(FedAvgM). 0.7 is FedAvg's own momentum, and it beat 0.9 on the validation half
(docs/benchmarks.md); --gossip-momentum 0 runs plain gossip.

Learning rate: every contender tries the same grid (--lr-grid) for --tune-updates client
updates, evaluated on the validation half of the test set (eval.split = validation); the
rate that reaches the target in the fewest updates (then: the best final validation
accuracy) is rerun on the full budget and reported on the disjoint test half. Every
contender evaluates its model (FedAvg's global model, gossip's consensus = average
model) after every round; the accuracies are compared as functions of client updates.
Reported per contender: the lr and the tuning grid's results, client updates to the
target accuracy (--target, 0.8), final accuracy, bytes each node sent (a gossip client:
its model to each neighbour it mixed with; a FedAvg client: its update per
participation, and the server's downloads separately), the spread of client models'
accuracies (gossip: a fixed subset of 10 clients' own models; FedAvg: one global model,
no spread), wall time; and the graphs' spectral gaps.

Keys: gossip_updates_ratio (client updates to the target, exponential gossip over
FedAvg; target <= 1.5), gossip_updates_ratio_ring, gossip_accuracy_gap (FedAvg's final
accuracy minus exponential gossip's, in points; target <= 2), bytes_per_node per
contender, ring_spectral_gap.

Why the MLP by default: on a CPU the CNN trains one client at a time (vmap batching is
refused for convolutions: slower), about 0.35 s per client update on this shared 2-core
machine; three contenders and their tuning grids would take hours. `--model cnn` runs
the default model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from fedveil.config import load_config
from fedveil.simulations.gossip.engine import gossip_graph
from fedveil.simulations.gossip.topology import spectral_gap
from fedveil.simulations.simulate_run import simulate

TARGETS = {"gossip_updates_ratio": ("<=", 1.5), "gossip_accuracy_gap": ("<=", 2.0)}
CONTENDERS = ("fedavg", "gossip_ring", "gossip_exponential")
PROGRESS = (0.6, 0.7, 0.75, 0.8)  # accuracies whose client updates each contender reports


def _job(args: argparse.Namespace) -> tuple[dict[str, Any], int, int, int, float]:
    if args.quick:
        base = {"data.dataset": "digits", "model.name": args.model or "mlp"}
        clients, per_round, updates, target = 20, 4, 80, 0.5
    else:
        base = {"data.dataset": "fashion-mnist", "model.name": args.model or "mlp"}
        clients, per_round, updates, target = 100, 20, 2000, 0.8
    clients = args.clients or clients
    per_round = args.per_round or per_round
    updates = args.updates or updates
    target = args.target if args.target is not None else target
    if not (0 < target <= 1):
        raise ValueError(f"--target {target}: must be in (0, 1]")
    if updates < clients or updates < per_round:
        raise ValueError(f"--updates {updates}: at least one gossip round ({clients} updates)")
    base.update({"data.num_clients": clients, "seed": args.seed, "simulation.plots": False})
    return base, clients, per_round, updates, target


def _active(args: argparse.Namespace, clients: int, per_round: int) -> int:
    """Clients awake per gossip round: --active, default FedAvg's cohort (equal client
    updates per round); 0 or the population: every client (synchronous D-PSGD)."""
    active = per_round if args.active is None else args.active
    if not 0 <= active <= clients:
        raise ValueError(f"--active {active}: must be in [0, {clients}]")
    return clients if active == 0 else active


def _configs(args: argparse.Namespace, updates: int | None = None) -> dict[str, dict[str, Any]]:
    """Each contender's config at `updates` client updates (default the budget)."""
    base, clients, per_round, budget, _ = _job(args)
    updates = updates or budget
    active = _active(args, clients, per_round)
    fedavg = {**base, "server.per_round": per_round, "server.rounds": updates // per_round}
    gossip = {
        **base,
        "server.aggregation": "gossip",
        "gossip.active": 0 if active == clients else active,
        "server.rounds": updates // active,
        "gossip.momentum": args.gossip_momentum,
    }
    return {
        "fedavg": fedavg,
        "gossip_ring": {**gossip, "gossip.topology": "ring"},
        "gossip_exponential": {**gossip, "gossip.topology": "exponential"},
    }


def _curve(run_dir: Path, gossip: bool) -> list[tuple[int, float]]:
    """(client updates so far, test accuracy) after each round."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out, updates = [], 0
    for row in rows:
        updates = row["client_updates"] if gossip else updates + int(row["cohort_aggregated"])
        acc = row.get("test_accuracy")
        if isinstance(acc, (int, float)) and math.isfinite(acc):
            out.append((updates, float(acc)))
    return out


def _to_target(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((u for u, acc in curve if acc >= target), None)


def _grid(args: argparse.Namespace) -> list[float]:
    try:
        grid = [float(v) for v in args.lr_grid.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--lr-grid {args.lr_grid!r}: comma-separated learning rates") from None
    if not grid or not all(0 < lr <= 10 for lr in grid):  # written so NaN fails
        raise ValueError(f"--lr-grid {args.lr_grid!r}: every rate must be in (0, 10]")
    return grid


def _train(values: dict[str, Any], out: Path) -> tuple[Any, dict[str, Any], float]:
    cfg = load_config(None, {**values, "out": str(out)})
    t0 = time.perf_counter()
    summary = simulate(cfg)
    return cfg, summary, time.perf_counter() - t0


def tune(args: argparse.Namespace, name: str, values: dict[str, Any]) -> dict[str, Any]:
    """The learning rate of the grid (the same grid for every contender) that reaches the
    target in the fewest client updates on the validation half of the test set (ties and
    misses: the higher final validation accuracy), at --tune-updates client updates. The
    test half, on which the contender is reported, is never read here."""
    _, _, _, budget, target = _job(args)
    tuning = _configs(args, args.tune_updates or budget // 2)[name]
    tried: dict[str, dict[str, Any]] = {}
    for lr in _grid(args):
        run_dir = Path(args.out) / "tune" / f"{name}-lr{lr:g}"
        values = {**tuning, "client.lr": lr, "eval.split": "validation"}
        _train(values, run_dir)
        curve = _curve(run_dir, name != "fedavg")
        tried[f"{lr:g}"] = {
            "updates_to_target": _to_target(curve, target),
            "final_accuracy": curve[-1][1] if curve else None,
        }
        _say(f"tune {name} lr {lr:g}: {json.dumps(tried[f'{lr:g}'])}")

    def rank(lr: str) -> tuple[float, float]:
        r = tried[lr]
        reach = r["updates_to_target"]
        return (math.inf if reach is None else reach, -(r["final_accuracy"] or 0.0))

    best = min(tried, key=rank)
    return {"lr": float(best), "grid": tried, "updates": args.tune_updates or budget // 2}


def run(args: argparse.Namespace) -> dict[str, Any]:
    _, _, _, _, target = _job(args)
    configs = _configs(args)
    results: dict[str, dict[str, Any]] = {}
    for name in CONTENDERS:
        values = {**configs[name], "eval.split": "test" if args.lr_grid else "all"}
        tuned = tune(args, name, configs[name]) if args.lr_grid else None
        if tuned is not None:
            values["client.lr"] = tuned["lr"]
        cfg, summary, wall = _train(values, Path(args.out) / name)
        run_dir = Path(cfg.out)
        gossip = name != "fedavg"
        curve = _curve(run_dir, gossip)
        size = _model_size(run_dir)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        result: dict[str, Any] = {
            "client_updates": curve[-1][0] if curve else 0,
            "rounds": summary["rounds"],
            "lr": cfg.client.lr,
            "updates_to_target": _to_target(curve, target),
            # The same read at lower accuracies: how the updates ratio develops.
            "updates_to_accuracy": {f"{a:g}": _to_target(curve, a) for a in PROGRESS},
            "final_accuracy": curve[-1][1] if curve else None,
            "wall_s": wall,
        }
        if tuned is not None:
            result["tuning"] = tuned
        if gossip:
            last = rows[-1]
            result["active_per_round"] = cfg.gossip.active or cfg.data.num_clients
            result["bytes_per_node"] = summary["bytes_sent_per_node"]
            result["spectral_gap"] = summary["spectral_gap"]
            result["degree"] = summary["degree_max"]
            result["client_accuracy_spread"] = {
                k: last[f"client_accuracy_{k}"] for k in ("min", "median", "max", "std")
            }
            result["consensus_distance"] = last["consensus_distance"]
        else:
            # A client sends its update (d float32 values) each time it takes part; the
            # server sends the model to every sampled client.
            uploads = sum(int(r["cohort_aggregated"]) for r in rows)
            result["bytes_per_node"] = uploads * size * 4 / cfg.data.num_clients
            result["server_bytes_sent"] = uploads * size * 4
            result["client_accuracy_spread"] = None  # one global model: every client's
        results[name] = result
        _say(f"{name}: {json.dumps(result)}")
    fed, exp, ring = results["fedavg"], results["gossip_exponential"], results["gossip_ring"]
    ring_cfg = load_config(None, configs["gossip_ring"])
    summary: dict[str, Any] = {
        "target_accuracy": target,
        "evaluated_on": "test half (lr tuned on the validation half)"
        if args.lr_grid
        else "the whole test set (no tuning)",
        "contenders": results,
        "gossip_updates_ratio": _ratio(exp["updates_to_target"], fed["updates_to_target"]),
        "gossip_updates_ratio_ring": _ratio(ring["updates_to_target"], fed["updates_to_target"]),
        "gossip_accuracy_gap": None
        if fed["final_accuracy"] is None or exp["final_accuracy"] is None
        else 100 * (fed["final_accuracy"] - exp["final_accuracy"]),
        "gossip_accuracy_gap_ring": None
        if fed["final_accuracy"] is None or ring["final_accuracy"] is None
        else 100 * (fed["final_accuracy"] - ring["final_accuracy"]),
        "bytes_per_node": {name: r["bytes_per_node"] for name, r in results.items()},
        "ring_spectral_gap": spectral_gap(gossip_graph(ring_cfg, ring_cfg.data.num_clients)),
        "exponential_spectral_gap": exp["spectral_gap"],
        "gossip_momentum": args.gossip_momentum,
        "job": configs["fedavg"],
        "targets": {k: f"{op} {v}" for k, (op, v) in TARGETS.items()},
    }
    summary["targets_met"] = {k: _meets(summary[k], op, v) for k, (op, v) in TARGETS.items()}
    return summary


def _ratio(a: int | None, b: int | None) -> float | None:
    """None when either never reached the target within the budget."""
    return None if a is None or b is None else a / b


def _meets(value: float | None, op: str, limit: float) -> bool:
    if value is None:
        return False
    return value <= limit if op == "<=" else value >= limit


def _model_size(run_dir: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(run_dir / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())  # noqa: SIM118


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def print_table(summary: dict[str, Any]) -> None:
    _say(f"target accuracy {summary['target_accuracy']}")
    head = ("contender", "updates->target", "final acc", "bytes/node", "wall s")
    _say(f"{head[0]:20} {head[1]:>16} {head[2]:>10} {head[3]:>12} {head[4]:>8}")
    for name, r in summary["contenders"].items():
        reach = r["updates_to_target"]
        _say(
            f"{name:20} {('never' if reach is None else reach):>16} "
            f"{r['final_accuracy']:>10.4f} {r['bytes_per_node']:>12.3g} {r['wall_s']:>8.1f}"
        )
    for key in (
        "gossip_updates_ratio",
        "gossip_updates_ratio_ring",
        "gossip_accuracy_gap",
        "ring_spectral_gap",
        "exponential_spectral_gap",
    ):
        _say(f"{key}: {summary[key]}")
    for key, met in summary["targets_met"].items():
        _say(f"target {key} {summary['targets'][key]}: {'met' if met else 'NOT met'}")


def add_gossip_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the gossip half of `fedveil bench decentral` (--part gossip)."""
    p.add_argument(
        "--quick", action="store_true", help="digits, 20 clients, target 0.5 (a smoke test)"
    )
    p.add_argument(
        "--model", default=None, help="logreg, mlp or cnn [mlp: the CNN cannot be vmapped on a CPU]"
    )
    p.add_argument("--clients", type=int, help="population [100; --quick 20]")
    p.add_argument("--per-round", type=int, help="FedAvg cohort [20; --quick 4]")
    p.add_argument(
        "--updates", type=int, help="client-update budget of each contender [2000; --quick 80]"
    )
    p.add_argument("--target", type=float, help="target accuracy [0.8; --quick 0.5]")
    p.add_argument(
        "--active",
        type=int,
        help="gossip clients awake per round [FedAvg's cohort: equal updates a round]; "
        "0: every client (synchronous D-PSGD)",
    )
    p.add_argument(
        "--gossip-momentum",
        type=float,
        default=0.7,
        help="gossip contenders' quasi-global momentum beta (gossip.momentum; QG-DSGDm); "
        "FedAvg keeps its own server momentum, 0.7; 0: plain gossip [0.7]",
    )
    p.add_argument(
        "--lr-grid",
        default="0.05,0.1,0.2,0.4",
        help="learning rates tried for every contender, each picked on the validation half "
        "of the test set and reported on the other half; '' : no tuning, client.lr as "
        "configured, the whole test set [0.05,0.1,0.2,0.4]",
    )
    p.add_argument(
        "--tune-updates", type=int, help="client updates of each tuning run [half of --updates]"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of data split and init [0]")
    p.add_argument(
        "--out",
        default="runs/bench-decentral",
        help="gossip run directories [runs/bench-decentral]",
    )
