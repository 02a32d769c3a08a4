"""`fedveil bench`: benchmarks, measured side by side in one invocation.

The benchmarks live in `benchmarks/` at the root of a source checkout, outside the
wheel. This module owns the command's flags, finds that folder and hands the parsed
flags to it; nothing here imports a benchmark before the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType

# Points at a checkout's benchmarks/ folder when fedveil is not installed from that checkout.
BENCHMARKS_ENV = "FEDVEIL_BENCHMARKS"
NEEDS_CHECKOUT = (
    "fedveil bench needs a source checkout (the benchmarks/ folder): git clone the fedveil "
    "repository, install it with `pip install -e .` and run it there, or set "
    f"{BENCHMARKS_ENV} to the checkout's benchmarks/ folder"
)
# `fedveil bench secagg --drop-stage`: the stages at which the failing clients raise
# (benchmarks.bench_secagg_round.DROP_STAGES maps each to its message kinds).
SECAGG_DROP_STAGES = ("advertise", "share_keys", "masked_input", "unmask")
SECAGG_SUMMARY = (
    "`fedveil bench secagg`: secure aggregation, protocol compute and whole rounds, ours vs Flower."
)


class BenchmarksNotFound(FileNotFoundError):
    """No benchmarks/ folder: fedveil runs from a wheel, not from a source checkout."""


def find_benchmarks() -> Path:
    """The checkout's benchmarks/ folder: $FEDVEIL_BENCHMARKS, else the one next to the
    editable install's source folders (the parent of the `fedveil/` package folder)."""
    configured = os.environ.get(BENCHMARKS_ENV)
    if configured:
        folder = Path(configured).expanduser().resolve()
        if not (folder / "__init__.py").is_file():
            raise BenchmarksNotFound(
                f"{BENCHMARKS_ENV} = {configured!r}: not a benchmarks/ folder "
                f"(no __init__.py); {NEEDS_CHECKOUT}"
            )
        return folder
    import fedveil

    folder = Path(fedveil.__file__).resolve().parent.parent / "benchmarks"
    if not (folder / "__init__.py").is_file():
        raise BenchmarksNotFound(NEEDS_CHECKOUT)
    return folder


def load_benchmark(name: str) -> ModuleType:
    """Import `benchmarks.<name>` from the checkout. The checkout's root also leads
    PYTHONPATH, so the benchmark's child processes (its contenders, Ray's workers) import
    the same folder."""
    root = str(find_benchmarks().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return importlib.import_module(f"benchmarks.{name}")


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

    p = bsub.add_parser(
        "secagg",
        help="secure aggregation: protocol compute and whole rounds, ours vs Flower's SecAgg+",
        description=SECAGG_SUMMARY
        + " Per-round times are medians of the steady rounds; --json prints one JSON object "
        "(with ratio and compute_ratio) as the last line of stdout.",
    )
    add_secagg_arguments(p)
    p.set_defaults(func=cmd_bench_secagg)

    p = bsub.add_parser(
        "fleet",
        help="capacity of one coordinator: emulated devices on the Fleet API, latency and CPU",
        description=FLEET_SUMMARY,
    )
    add_fleet_arguments(p)
    p.set_defaults(func=cmd_bench_fleet)

    p = bsub.add_parser(
        "flower-secagg",
        help="secure aggregation for a Flower FedAvg app: round overhead, ours vs Flower's SecAgg+",
        description=FLOWER_SECAGG_SUMMARY,
    )
    add_flower_secagg_arguments(p)
    p.set_defaults(func=cmd_bench_flower_secagg)

    p = bsub.add_parser(
        "robust",
        help="poisoning attacks x robust aggregators: accuracy, backdoor accuracy, bound failures",
        description=ROBUST_SUMMARY,
    )
    add_robust_arguments(p)
    p.set_defaults(func=cmd_bench_robust)

    p = bsub.add_parser(
        "serve",
        help="the prediction service vs calling the model directly: throughput, latency",
        description=SERVE_SUMMARY,
    )
    add_serve_arguments(p)
    p.set_defaults(func=cmd_bench_serve)

    p = bsub.add_parser(
        "audit",
        help="privacy under attack: update inversion, membership inference, canary audit",
        description=AUDIT_SUMMARY,
    )
    add_audit_arguments(p)
    p.set_defaults(func=cmd_bench_audit)

    p = bsub.add_parser(
        "dpftrl",
        help="DP-FTRL vs DP-FedAvg at equal epsilon on 3,000 Fashion-MNIST users",
        description=DPFTRL_SUMMARY,
    )
    add_dpftrl_arguments(p)
    p.set_defaults(func=cmd_bench_dpftrl)

    p = bsub.add_parser(
        "async",
        help="sync vs asynchronous training (FedBuff, secagg groups): simulated time to target",
        description=ASYNC_SUMMARY,
    )
    add_async_arguments(p)
    p.set_defaults(func=cmd_bench_async)


DPFTRL_SUMMARY = (
    "`fedveil bench dpftrl`: Fashion-MNIST split into 3,000 clients of 20 examples, 100 per "
    "round, 300 rounds; at equal epsilon and delta (2 and 8): DP-FTRL (banded matrix "
    "factorisation under min-separation N/m), DP-FedAvg under the same schema without "
    "amplification, DP-FedAvg composed at q = 1, DP-FedAvg amplified by secret Poisson "
    "cohorts, and no DP; each method's server learning rate tuned on a validation half of "
    "the test set, 3 seeds. Prints noise_rmse_ratio (exact), accuracy_gain_eps2 and _eps8, "
    "and DP-FTRL minus the amplified DP-FedAvg; --json prints one JSON object as the last "
    "line of stdout; --quick is a cheap check."
)


def add_dpftrl_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench dpftrl` (also `python -m benchmarks.bench_dpftrl`)."""
    p.add_argument("--clients", type=int, default=3000, help="population N [3000]")
    p.add_argument("--per-round", type=int, default=100, help="cohort m [100]")
    p.add_argument("--rounds", type=int, default=300, help="rounds T [300]")
    p.add_argument("--seeds", type=int, default=3, help="seeds per method [3]")
    p.add_argument("--epsilons", default="2,8", help="comma-separated epsilons [2,8]")
    p.add_argument(
        "--accountant",
        choices=("pld", "rdp"),
        default="pld",
        help="accountant calibrating the DP-FedAvg contenders 3 and 4 (pld: tight; rdp: "
        "fast, looser, so it favours DP-FTRL) [pld]",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a cheap check: 600 clients, 20 per round, 30 rounds, 1 seed, one learning rate",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_dpftrl(args: argparse.Namespace) -> int:
    return load_benchmark("bench_dpftrl").cmd_bench_dpftrl(args)


ASYNC_SUMMARY = (
    "`fedveil bench async`: the default job trained synchronously (waiting for every "
    "client; with a deadline at the p90 client latency) and asynchronously (FedBuff; FedBuff "
    "with secure aggregation in groups), the same clients in flight, log-normal client "
    "latency on the simulated clock, each contender in its own process, over seeds; prints "
    "median simulated time to the target accuracy, CPU seconds per applied client update "
    "(worker processes included), the ratios, and FedBuff's published ratio next to ours; "
    "accuracy_over_time.png goes into --out. --json prints one JSON object as the last "
    "line of stdout."
)
# The contenders, in the order they run (benchmarks/bench_async.py says what each is).
ASYNC_CONTENDERS = ("sync", "sync_deadline", "async", "async_secagg")
# The default job's training time per client (fashion-mnist CNN, ~600 examples, one
# epoch, batch 32): 0.27-0.73 s measured on one core of a shared 2-core machine.
ASYNC_LATENCY_MEDIAN_S = 0.5
# A secure-aggregation key or unmask exchange, against a training: a client of a group of
# 10 computes 0.25 ms (advertise), 4.5 ms (share keys) and 0.07 ms (unmask) for the CNN
# here, about 1% of the training above, so what remains is a network round trip; a tenth
# of the training time stands for a phone's slow round trip (~0.1-1 s) against minutes
# of on-device training: the pessimistic end.
ASYNC_MESSAGE_LATENCY_SHARE = 0.1


def add_async_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench async` (also `python -m benchmarks.bench_async`)."""
    p.add_argument(
        "--quick", action="store_true", help="a small digits job, one seed, target 0.5 (smoke)"
    )
    p.add_argument("--seeds", type=int, help="seeds, from --seed on [3; --quick 1]")
    p.add_argument("--seed", type=int, default=0, help="first seed [0]")
    p.add_argument(
        "--concurrency", type=int, help="clients in flight: sync cohort = async C [20; --quick 6]"
    )
    p.add_argument("--buffer", type=int, help="async: apply after K arrivals [10; --quick 3]")
    p.add_argument("--group-size", type=int, help="async_secagg: secagg group size G [K]")
    p.add_argument(
        "--group-deadline",
        choices=("p90", "none"),
        default="p90",
        help="async_secagg: each protocol stage's deadline (server.round_timeout): the p90 "
        "client latency, as sync_deadline's, stragglers dropped and recovered; or none, "
        "every stage waits for its slowest member [p90]",
    )
    p.add_argument(
        "--latency-median",
        type=float,
        default=ASYNC_LATENCY_MEDIAN_S,
        help=f"median client latency in s: the default job's training time per client "
        f"[{ASYNC_LATENCY_MEDIAN_S:g}]; time ratios do not depend on it",
    )
    p.add_argument(
        "--message-latency-share",
        type=float,
        default=ASYNC_MESSAGE_LATENCY_SHARE,
        help="async_secagg: median latency of a secure-aggregation stage in which a client "
        "computes nothing on its data (advertise, share keys, unmask), as a share of the "
        f"training latency median (simulation.message_latency_share) "
        f"[{ASYNC_MESSAGE_LATENCY_SHARE:g}]",
    )
    p.add_argument("--target", type=float, help="target test accuracy [0.80; --quick 0.5]")
    p.add_argument(
        "--max-updates",
        type=int,
        help="client updates a contender may apply before giving up on the target "
        "[100 x C; --quick 8 x C]",
    )
    p.add_argument(
        "--contenders",
        type=_names,
        help=f"comma list, a subset of {','.join(ASYNC_CONTENDERS)} [all]",
    )
    p.add_argument(
        "--out", default="runs/bench-async", help="run directories and plots [runs/bench-async]"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_async(args: argparse.Namespace) -> int:
    unknown = set(args.contenders or ()) - set(ASYNC_CONTENDERS)
    if unknown:
        raise ValueError(
            f"--contenders: unknown {sorted(unknown)}; choose from {', '.join(ASYNC_CONTENDERS)}"
        )
    return load_benchmark("bench_async").cmd_bench_async(args)


AUDIT_SUMMARY = (
    "`fedveil bench audit`: the three privacy-audit benchmarks (update inversion against "
    "one client's update, the secure sum and its DP release; membership inference on a "
    "non-private and a DP run of an overfit config; the canary audit's power and "
    "soundness and its cost) in one process; --json prints one JSON object with every "
    "benchmark's keys as the last line of stdout."
)


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench audit` (also `python -m benchmarks.bench_audit_all`)."""
    p.add_argument(
        "--quick", action="store_true", help="every benchmark at a tiny size (a smoke test)"
    )
    p.add_argument("--seeds", type=int, help="inversion and membership seeds [3]")
    p.add_argument("--images", type=int, help="inversion: single-image updates per seed [10]")
    p.add_argument("--curve-seeds", type=int, help="inversion: seeds per curve point [--seeds]")
    p.add_argument("--shadows", type=int, help="membership: shadow models per run [4]")
    p.add_argument("--canaries", type=int, help="canary audit: canaries per audit [1000]")
    p.add_argument("--audit-seeds", type=int, help="canary audit: correct-mechanism seeds [20]")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_audit(args: argparse.Namespace) -> int:
    return load_benchmark("bench_audit_all").cmd_bench_audit(args)


SERVE_SUMMARY = (
    "`fedveil bench serve`: `fedveil serve` on loopback (the default simulate task's CNN, "
    "random weights) against calling the model directly on batches of the request size: "
    "served rows/s for NPZ requests of 32 and 256 images and JSON of 32 (closed loop, the "
    "best of --concurrency), each measured --repeat times back to back with the direct "
    "rate (the median pair's ratio), the merged batch sizes from the server's /metrics, the load "
    "generator's CPU share (its own process), and p50/p99 latency at increasing offered "
    "rates (open loop, Poisson) up to and past saturation; --json prints one JSON object "
    "as the last line of stdout."
)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench serve` (also `python -m benchmarks.bench_serve`)."""
    p.add_argument("--quick", action="store_true", help="short phases, few rates (a smoke test)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per load phase [3]")
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="direct/served pairs per request kind, back to back; the median ratio [3]",
    )
    p.add_argument(
        "--concurrency",
        type=_positive_list,
        default=[2, 4, 8],
        metavar="C,C,...",
        help="closed-loop connections tried; the best is the saturated rate [2,4,8]",
    )
    p.add_argument("--max-batch", type=int, help="passed to fedveil serve [its default]")
    p.add_argument("--max-wait-ms", type=float, help="passed to fedveil serve [its default]")
    p.add_argument("--threads", type=int, help="passed to fedveil serve [its default]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_serve(args: argparse.Namespace) -> int:
    return load_benchmark("bench_serve").cmd_bench_serve(args)


def add_secagg_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench secagg` (also `python -m benchmarks.bench_secagg_round`)."""
    p.add_argument("--clients", type=int, default=100, help="clients, all sampled [100]")
    p.add_argument("--dim", type=int, default=100_000, help="model parameters [100000]")
    p.add_argument("--dropout", type=float, default=0.1, help="fraction that fails [0.1]")
    p.add_argument("--neighbors", type=int, help="neighbours k [from the threat model]")
    p.add_argument("--threshold", type=int, help="Shamir threshold t [from the threat model]")
    p.add_argument("--peer", choices=["flower"], help="also run Flower's SecAgg+")
    p.add_argument(
        "--rounds", type=int, default=4, help="rounds per run; the first and last excluded [4]"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per round configuration, interleaved, and compute runs per side (each side "
        "keeps its cheapest) [1]",
    )
    p.add_argument(
        "--drop-stage",
        choices=list(SECAGG_DROP_STAGES),
        default="masked_input",
        help="stage at which the failing clients raise [masked_input]",
    )
    p.add_argument(
        "--transport",
        choices=["flower", "inprocess"],
        default="flower",
        help="where our rounds run [flower]; inprocess has no peer",
    )
    p.add_argument("--examples", type=int, default=8, help="most examples per client [8]")
    p.add_argument("--no-compute", action="store_true", help="skip the protocol compute part")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also run plain rounds with 1 extra empty exchange: the transport's share of "
        "our steady secure round's overhead, and the best ratio it allows",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


# The SuperNode's sleep after an empty PullMessages (flwr 1.42, start_client_internal.py).
FLOWER_IDLE_POLL_S = 3.0
FLEET_SUMMARY = (
    "`fedveil bench fleet`: start a real coordinator on loopback (TLS, SuperNode "
    "authentication) and hold N emulated devices on its Fleet gateway at Flower's idle "
    "poll, with requests built and signed by Flower's SuperNode client code; print p50/p99 "
    "Fleet request latency and the coordinator's CPU and RSS per N. --json prints one JSON "
    "object as the last line of stdout."
)


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench fleet` (also `python -m benchmarks.bench_fleet`)."""
    p.add_argument(
        "--devices",
        type=_positive_list,
        default=[100],
        metavar="N[,N,...]",
        help="emulated devices; a list sweeps them against one coordinator [100]",
    )
    p.add_argument("--window", type=float, default=30.0, help="measured seconds per N [30]")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds before the window [10]")
    p.add_argument(
        "--poll",
        type=float,
        default=FLOWER_IDLE_POLL_S,
        help=f"seconds between a device's pulls [{FLOWER_IDLE_POLL_S:g}: Flower's idle poll]",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="write a cProfile (pstats) of the coordinator process to FILE",
    )
    p.add_argument(
        "--secagg-round",
        type=int,
        metavar="N",
        help="also run one secure-aggregation round of N emulated devices (fresh "
        "coordinator) and compare its model with `fedveil simulate` (secagg_round_ok)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


FLOWER_SECAGG_SUMMARY = (
    "`fedveil bench flower-secagg`: a Flower Message-API FedAvg app run plain and with "
    "fedveil.flower.secure (fedveil_secagg_mod on the clients), against Flower's SecAgg+ "
    "on its legacy path run plain and secure, on Flower's simulation engine with the same "
    "workload, k, t and quantisation; prints each side's round overhead (secure minus plain "
    "round, steady-round medians) and their ratio. --json prints one JSON object as the "
    "last line of stdout."
)


def add_flower_secagg_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench flower-secagg` (also `python -m
    benchmarks.bench_flower_strategy_secagg`)."""
    p.add_argument("--clients", type=int, default=100, help="clients, all sampled [100]")
    p.add_argument("--dim", type=int, default=100_000, help="model parameters [100000]")
    p.add_argument("--rounds", type=int, default=4, help="rounds; first and last excluded [4]")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration [1]")
    p.add_argument("--neighbors", type=int, help="neighbours k [from the threat model]")
    p.add_argument("--threshold", type=int, help="Shamir threshold t [from the threat model]")
    p.add_argument("--examples", type=int, default=8, help="most examples per client [8]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


ROBUST_SUMMARY = (
    "`fedveil bench robust`: poisoning attacks x aggregators (issue 22): final and backdoor "
    "accuracy next to each aggregator's clean run, the rounds whose attacker bound failed, "
    "and the backdoor curve of model replacement over attacker fractions. --json prints one "
    "JSON object (table, clean_accuracy, backdoor_curve, targets) as the last line of stdout."
)
# The plain mean under secure aggregation: attackers go through the client's own clip.
SECAGG_MEAN = "secagg_mean"
# norm_bound's M just above most honest updates' L2 norms with the default mlp and training
# (clean runs, seed 0: 17% of updates clipped on fashion-mnist, 28% on digits).
ROBUST_NORM_BOUNDS = {"fashion-mnist": 1.0, "digits": 0.3}


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 0.1,0.2") from None


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def add_robust_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench robust` (also `python -m benchmarks.bench_robust`)."""
    p.add_argument(
        "--dataset", choices=["fashion-mnist", "digits"], default="fashion-mnist",
        help="[fashion-mnist]; digits for a quick look",
    )  # fmt: skip
    p.add_argument("--model", default="mlp", help="built-in model (mlp, cnn, logreg) [mlp]")
    p.add_argument("--clients", type=int, default=100, help="population [100]")
    p.add_argument("--per-round", type=int, default=20, help="clients per round [20]")
    p.add_argument("--rounds", type=int, default=10, help="rounds per run [10]")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration [0.5]")
    p.add_argument(
        "--attacks",
        type=_names,
        default=["sign_flip", "gaussian", "scaled"],
        help="comma list of label_flip, sign_flip, gaussian, scaled, backdoor "
        "[sign_flip,gaussian,scaled]",
    )
    p.add_argument(
        "--aggregators",
        type=_names,
        default=["mean", "median", "trimmed_mean", "multi_krum", "norm_bound", SECAGG_MEAN],
        help="comma list of mean, median, trimmed_mean, krum, multi_krum, bulyan, "
        f"norm_bound, {SECAGG_MEAN} [mean,median,trimmed_mean,multi_krum,norm_bound,"
        f"{SECAGG_MEAN}]",
    )
    p.add_argument("--fractions", type=_floats, default=[0.1, 0.2], help="[0.1,0.2]")
    p.add_argument(
        "--curve-fractions",
        type=_floats,
        default=[0.01, 0.05, 0.1, 0.2],
        help="backdoor curve fractions; empty string for none [0.01,0.05,0.1,0.2]",
    )
    p.add_argument(
        "--f-rule",
        choices=["tail", "mean"],
        default="tail",
        help="robust rules' f: covers the attackers of 95%% of cohorts (tail) or of an "
        "average one (mean) [tail]",
    )
    p.add_argument("--scale", type=float, default=10.0, help="sign_flip/scaled factor [10]")
    p.add_argument("--std", type=float, default=10.0, help="gaussian attack std [10]")
    p.add_argument(
        "--norm-bound",
        type=float,
        help="norm_bound M, just above most honest update norms [fashion-mnist 1.0, digits 0.3]",
    )
    p.add_argument(
        "--weak-dp-noise", type=float, default=0.001, help="norm_bound+weak_dp std [0.001]"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_robust(args: argparse.Namespace) -> int:
    return load_benchmark("bench_robust").cmd_bench_robust(args)


def cmd_bench_flower_secagg(args: argparse.Namespace) -> int:
    return load_benchmark("bench_flower_strategy_secagg").cmd_bench_flower_secagg(args)


def cmd_bench_fleet(args: argparse.Namespace) -> int:
    return load_benchmark("bench_fleet").cmd_bench_fleet(args)


def cmd_bench_secagg(args: argparse.Namespace) -> int:
    return load_benchmark("bench_secagg_round").cmd_bench_secagg(args)


def cmd_bench_simulation(args: argparse.Namespace) -> int:
    bs = load_benchmark("bench_simulation")
    Workload = load_benchmark("bench_workload").Workload

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
