"""`fedveil bench BENCHMARK [FLAGS]`: benchmarks, measured side by side in one invocation.

The benchmarks are the package `fedveil.benchmarks` (benchmarks/ in a checkout; the
wheel carries it), each a module that owns its flags, constants and entry point
(`main(argv, prog)`, see benchmarks/harness.py). This module only lists them: it imports
a benchmark when the command names it, so `fedveil` does not load every benchmark's
dependencies (torch, Flower, ...) to start another command. `fedveil bench X --help`
prints the benchmark's own flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """One `fedveil bench` benchmark: its one-line help and its module's `main`."""

    help: str
    main: Callable[[Sequence[str], str], int]


def _simulation(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_simulation

    return bench_simulation.main(argv, prog)


def _secagg(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_secagg_round

    return bench_secagg_round.main(argv, prog)


def _fleet(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_fleet

    return bench_fleet.main(argv, prog)


def _flower_secagg(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_flower_strategy_secagg

    return bench_flower_strategy_secagg.main(argv, prog)


def _robust(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_robust

    return bench_robust.main(argv, prog)


def _serve(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_serve

    return bench_serve.main(argv, prog)


def _audit(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_audit_all

    return bench_audit_all.main(argv, prog)


def _async(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_async

    return bench_async.main(argv, prog)


def _decentral(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_decentral

    return bench_decentral.main(argv, prog)


def _default(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_default

    return bench_default.main(argv, prog)


def _dpftrl(argv: Sequence[str], prog: str) -> int:
    from fedveil.benchmarks import bench_dpftrl

    return bench_dpftrl.main(argv, prog)


BENCHMARKS: dict[str, Benchmark] = {
    "simulation": Benchmark(
        "the in-process engine against a bare torch loop and Flower's simulation", _simulation
    ),
    "secagg": Benchmark(
        "secure aggregation: protocol compute and whole rounds, ours vs Flower's SecAgg+", _secagg
    ),
    "fleet": Benchmark(
        "capacity of one coordinator: emulated devices on the Fleet API, latency and CPU", _fleet
    ),
    "flower-secagg": Benchmark(
        "secure aggregation for a Flower FedAvg app: round overhead, ours vs Flower's SecAgg+",
        _flower_secagg,
    ),
    "robust": Benchmark(
        "poisoning attacks x robust aggregators: accuracy, backdoor accuracy, bound failures",
        _robust,
    ),
    "serve": Benchmark(
        "the prediction service vs calling the model directly: throughput, latency", _serve
    ),
    "audit": Benchmark(
        "privacy under attack: update inversion, membership inference, canary audit", _audit
    ),
    "async": Benchmark(
        "sync vs asynchronous training (FedBuff, secagg groups): simulated time to target",
        _async,
    ),
    "decentral": Benchmark(
        "no coordinator: secure vs plain all-reduce vs the coordinator's secure round; "
        "gossip vs FedAvg at equal client updates",
        _decentral,
    ),
    "default": Benchmark(
        "the default job (fedveil simulate) vs the bare torch FedAvg loop: time to 85%", _default
    ),
    "dpftrl": Benchmark(
        "DP-FTRL vs DP-FedAvg at equal epsilon: prefix-sum noise and accuracy", _dpftrl
    ),
}


def add_bench(sub: argparse._SubParsersAction) -> None:
    listing = "\n".join(f"  {name:<15}{b.help}" for name, b in BENCHMARKS.items())
    p = sub.add_parser(
        "bench",
        help="benchmarks",
        description="Run one benchmark: it measures fedveil and its peer side by side and "
        "prints a table (with --json, one JSON object as the last line of stdout).",
        epilog=f"benchmarks:\n{listing}\n\n`fedveil bench BENCHMARK --help` lists its flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("benchmark", choices=list(BENCHMARKS), metavar="BENCHMARK", help="see below")
    p.add_argument(
        "flags", nargs=argparse.REMAINDER, help="the benchmark's flags (BENCHMARK --help)"
    )
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    return BENCHMARKS[args.benchmark].main(args.flags, f"fedveil bench {args.benchmark}")
