"""`fedveil bench`: benchmarks, measured side by side in one invocation."""

from __future__ import annotations

import argparse
import json
import sys


def _positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers like 1000,10000") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    s = bsub.add_parser(
        "simulation",
        help="the in-process engine against a bare torch loop and Flower's simulation",
        description="Train the same workload (100k-parameter MLP, ~100 generated 28x28 "
        "examples per client, one local epoch, batch 32) with a bare torch loop, with "
        "fedveil's in-process engine and, with --peer flower, with Flower's simulation "
        "engine, each in a fresh process; print per-round time (median of rounds 2..R), "
        "start-up, end-to-end time and peak memory of each process tree, and the ratios.",
    )
    s.add_argument("--clients", type=int, default=100, help="population size [100]")
    s.add_argument("--per-round", type=int, help="clients per round [all]")
    s.add_argument("--rounds", type=int, default=5, help="rounds [5]")
    s.add_argument("--peer", choices=["flower"], help="also run the peer framework")
    s.add_argument("--workers", type=int, default=0, help="our worker processes [0: one per core]")
    s.add_argument("--examples", type=int, default=100, help="examples per client [100]")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every contender this many times, in turn; report medians [1]",
    )
    s.add_argument(
        "--population",
        type=_positive_list,
        metavar="N,N,...",
        help="memory mode: ours only, at each population size with --per-round clients "
        "per round; reports how peak memory grows with the population",
    )
    s.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    s.set_defaults(func=cmd_bench_simulation)

    from fedveil.simulations.bench_secagg_round import add_secagg_bench

    add_secagg_bench(bsub)


def cmd_bench_simulation(args: argparse.Namespace) -> int:
    from fedveil.simulations import bench_simulation as bs
    from fedveil.simulations.bench_workload import Workload

    if args.workers < 0:
        raise ValueError(f"--workers = {args.workers}: must be >= 0")
    per_round = args.per_round if args.per_round is not None else args.clients
    if args.population:
        per_round = args.per_round if args.per_round is not None else 100
        clients = min(args.population)
    else:
        clients = args.clients
    w = Workload(
        clients=clients,
        per_round=per_round,
        rounds=args.rounds,
        examples=args.examples,
        seed=args.seed,
    )
    if args.population:
        summary = bs.bench_population(w, args.population, workers=args.workers, repeat=args.repeat)
        print(bs.format_population(summary), file=sys.stderr if args.json else sys.stdout)
    else:
        summary = bs.bench(w, peer=args.peer, workers=args.workers, repeat=args.repeat)
        print(bs.format_report(summary), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0
