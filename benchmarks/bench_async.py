"""`fedveil bench async`: synchronous and asynchronous training side by side (issue 21).

Four contenders train the default job (`fedveil simulate`'s defaults: Fashion-MNIST,
100 clients, Dirichlet(0.5), the small CNN, one local epoch) with the same number of
clients in flight (sync cohort = async concurrency C), on the simulated clock of the
availability model: client latency log-normal, median `--latency-median` (the default
job's training time per client), sigma 1.0 per draw and 0.5 per client.

- sync: FedAvg waiting for every sampled client (what FedBuff compared with);
- sync_deadline: FedAvg with server.round_timeout at the 90th percentile of the client
  latencies the run draws (stragglers past it are lost);
- async: FedBuff, an update after every K arrivals, staleness weight 1/sqrt(1+tau);
- async_secagg: async with secure aggregation in over-provisioned groups, by default the
  best design measured (docs/explanation/performance.md, issue 36): G clients dispatched,
  the group released at its first R masked inputs (server.group_release_at; R = K,
  G = K + ceil(0.9 K) by default, at most C: 19 for K = 10), the other G - R dropped by
  design and their masks removed by dropout recovery (the threat model's dropout rate
  covers them, so t and k are derived for G); each protocol stage has sync_deadline's
  deadline (--group-deadline p90), a member past it is dropped as well; a group goes out
  once S = ceil(0.8 R) slots are free (8 for R = 10), its other members starting to train
  as slots come free (--dispatch-at, server.group_dispatch_at; 0: once G are, the whole
  group at once), each on the model current at its own start (--member-model,
  server.group_member_model); its unmask stage ends at the first t replies
  (--unmask, server.group_unmask; where the neighbour graph is complete);
- async_secagg_whole: the previous design, side by side: groups of G = K that wait for
  every member (or the deadline).

Each contender runs in its own process (`fedveil.benchmarks.async_contender`) and stops at the
first evaluation at the target accuracy; the parent reads the process's CPU time, worker
processes included, from wait4's rusage. Time to target is simulated seconds
(`sim_clock_s`). Sync evaluates every round (C client updates); async every C/K versions,
so both evaluate once per C client updates (same evaluation CPU per update, same
resolution in updates). Ratios are of the medians over seeds. Every simulated second is
a latency draw times the median, so the time ratios do not depend on `--latency-median`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedveil.benchmarks.harness import (
    command_main,
    medians,
    name_list,
    print_report,
    ratio,
    run_seeds,
)
from fedveil.benchmarks.harness import run_contender as run_contender_process
from fedveil.config import SecAggSection
from fedveil.privacy.secagg.params import ThreatModel, find_parameters
from fedveil.protocol.kinds import Kind
from fedveil.simulations.async_plots import accuracy_over_time, staleness_values, time_to_target
from fedveil.simulations.availability import AvailabilityModel

# FedBuff (Nguyen et al., AISTATS 2022) as ../shared/ANCHORS.md cites it: about 3x less
# wall-clock time than synchronous FedAvg (which waits for every client) for the same accuracy.
PEER = {"name": "FedBuff (Nguyen et al., AISTATS 2022)", "time_to_target_ratio": 3.0}
TARGETS = {
    "time_to_target_ratio": (">=", 3.0),
    "time_to_target_ratio_deadline": (">=", 1.5),
    "cpu_per_update_ratio": ("<=", 1.2),
    "secagg_overhead_ratio": ("<=", 1.5),
    "secagg_whole_overhead_ratio": ("<=", 1.5),
}
LABELS = {
    "sync": "sync FedAvg, waits for every client",
    "sync_deadline": "sync FedAvg, p90 deadline",
    "async": "async FedBuff",
    "async_secagg": "async FedBuff + secagg, R of G",
    "async_secagg_whole": "async FedBuff + secagg, whole groups",
}


ASYNC_SUMMARY = (
    "`fedveil bench async`: the default job trained synchronously (waiting for every "
    "client; with a deadline at the p90 client latency) and asynchronously (FedBuff; FedBuff "
    "with secure aggregation in groups of G released at their first R; in whole groups), "
    "the same clients in flight, log-normal client "
    "latency on the simulated clock, each contender in its own process, over seeds; prints "
    "median simulated time to the target accuracy, CPU seconds per applied client update "
    "(worker processes included), the ratios, and FedBuff's published ratio next to ours; "
    "accuracy_over_time.png goes into --out. --json prints one JSON object as the last "
    "line of stdout."
)
# The contenders, in the order they run (benchmarks/bench_async.py says what each is).
ASYNC_CONTENDERS = ("sync", "sync_deadline", "async", "async_secagg", "async_secagg_whole")
# async_secagg's default over-provisioning: G = K + ceil(OVER_PROVISION x K) members per
# group (at most C), released at the first R = K: 19 for K = 10, the best G measured
# (docs/explanation/performance.md, "Over-provisioning swept").
OVER_PROVISION = 0.9
# async_secagg's default rolling dispatch: a group goes out once S = ceil(DISPATCH_AT x R)
# slots are free (8 for R = 10, the best S measured with G = 19).
DISPATCH_AT = 0.8
# The default job's training time per client (fashion-mnist CNN, ~600 examples, one
# epoch, batch 32): 0.27-0.73 s measured on one core of a shared 2-core machine.
ASYNC_LATENCY_MEDIAN_S = 0.5
DEFAULT_DROPOUT_RATE = SecAggSection().dropout_rate
# A secure-aggregation key or unmask exchange, against a training: a client of a group of
# 10 computes 0.25 ms (advertise), 4.5 ms (share keys) and 0.07 ms (unmask) for the CNN
# here, about 1% of the training above, so what remains is a network round trip; a tenth
# of the training time stands for a phone's slow round trip (~0.1-1 s) against minutes
# of on-device training: the pessimistic end.
ASYNC_MESSAGE_LATENCY_SHARE = 0.1


def add_async_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench async`."""
    p.add_argument(
        "--quick", action="store_true", help="a small digits job, one seed, target 0.5 (smoke)"
    )
    p.add_argument("--seeds", type=int, help="seeds, from --seed on [3; --quick 1]")
    p.add_argument("--seed", type=int, default=0, help="first seed [0]")
    p.add_argument(
        "--concurrency", type=int, help="clients in flight: sync cohort = async C [20; --quick 6]"
    )
    p.add_argument("--buffer", type=int, help="async: apply after K arrivals [10; --quick 3]")
    p.add_argument(
        "--group-size",
        type=int,
        help="async_secagg: members G dispatched per secagg group "
        f"[K + ceil({OVER_PROVISION:g} K), at most C: 19 for K = 10; K with --release-at 0]",
    )
    p.add_argument(
        "--release-at",
        type=int,
        help="async_secagg: a group is released at its first R masked inputs "
        "(server.group_release_at) [K]; 0: at every member, as async_secagg_whole",
    )
    p.add_argument(
        "--dispatch-at",
        type=int,
        help="async_secagg: a group goes out once S slots are free, its other members "
        "starting to train as slots come free (server.group_dispatch_at) "
        f"[ceil({DISPATCH_AT:g} R): 8 for R = 10]; 0: once G are free, the whole group at "
        "once",
    )
    p.add_argument(
        "--member-model",
        choices=("dispatch", "start"),
        help="async_secagg with rolling dispatch: the model a member trains on "
        "(server.group_member_model): the group's, or the one current at the member's own "
        "start [start with rolling dispatch (0 < S < G), else dispatch]",
    )
    p.add_argument(
        "--start-order",
        choices=("client_id", "random"),
        default="client_id",
        help="async_secagg with rolling dispatch: the order in which a group's members take "
        "the slots as they come free (server.group_start_order) [client_id]",
    )
    p.add_argument(
        "--unmask",
        choices=("survivors", "threshold"),
        help="async_secagg: when a group's unmask stage ends (server.group_unmask): once "
        "every survivor has sent its shares, or at the first t replies [threshold for a "
        "group released at R whose neighbour graph is complete (every G up to 32), else "
        "survivors]",
    )
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
        type=name_list,
        help=f"comma list, a subset of {','.join(ASYNC_CONTENDERS)} [all]",
    )
    p.add_argument(
        "--out", default="runs/bench-async", help="run directories and plots [runs/bench-async]"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


@dataclass(frozen=True)
class Setup:
    """What every contender shares; the flags of `fedveil bench async`, resolved."""

    base: dict[str, Any]  # config values of the job itself (default job, or --quick's)
    concurrency: int
    buffer: int
    group_size: int
    release_at: int  # async_secagg: R of G (0: every member)
    dispatch_at: int  # async_secagg: server.group_dispatch_at S (0: G, at once)
    member_model: str  # async_secagg: server.group_member_model (rolling dispatch)
    start_order: str  # async_secagg: server.group_start_order (rolling dispatch)
    unmask: str  # async_secagg: server.group_unmask (survivors | threshold)
    group_deadline: bool  # async_secagg: round_timeout at the p90 latency, as sync_deadline
    latency_median: float
    message_latency_share: float  # async_secagg's key and unmask stages, of latency_median
    max_updates: int  # client-update budget of a contender that never reaches the target
    target: float


def resolve(args: argparse.Namespace) -> Setup:
    base: dict[str, Any] = {}
    if args.quick:  # seconds: a small digits job, a low target
        base = {"data.dataset": "digits", "data.num_clients": 20, "model.name": "mlp"}
    c = args.concurrency or (6 if args.quick else 20)
    k = args.buffer or (3 if args.quick else 10)
    if not 1 <= k <= c:
        raise ValueError(f"--buffer = {k}: must be in [1, --concurrency = {c}]")
    r = k if args.release_at is None else args.release_at
    g = args.group_size or (min(c, k + math.ceil(OVER_PROVISION * k)) if r else k)
    if g < max(k, 3) or g > c:  # the secagg protocol needs 3 clients at least
        raise ValueError(
            f"--group-size = {g}: must be in [max(3, --buffer = {k}), --concurrency = {c}]"
        )
    if r and not 3 <= r <= g:
        raise ValueError(f"--release-at = {r}: must be 0 or in [3, --group-size = {g}]")
    # The defaults are the best design measured (a group released at R); with
    # --release-at 0 the groups are whole and go out at once, as async_secagg_whole's.
    dispatch_at = args.dispatch_at
    if dispatch_at is None:
        dispatch_at = min(g, math.ceil(DISPATCH_AT * r)) if r else 0
    if not 0 <= dispatch_at <= g:
        raise ValueError(f"--dispatch-at = {dispatch_at}: must be 0 or in [1, --group-size = {g}]")
    rolling = 0 < dispatch_at < g
    member_model = args.member_model or ("start" if rolling else "dispatch")
    unmask = args.unmask or ("threshold" if r and complete_graph(g, r) else "survivors")
    return Setup(
        base=base,
        concurrency=c,
        buffer=k,
        group_size=g,
        release_at=r,
        dispatch_at=dispatch_at,
        member_model=member_model,
        start_order=args.start_order,
        unmask=unmask,
        group_deadline=args.group_deadline == "p90",
        latency_median=args.latency_median,
        message_latency_share=args.message_latency_share,
        max_updates=args.max_updates or (8 * c if args.quick else 100 * c),
        target=args.target if args.target is not None else (0.5 if args.quick else 0.80),
    )


def complete_graph(g: int, r: int) -> bool:
    """Whether async_secagg's groups of G released at R get a complete neighbour graph
    from the threat model the bench sets (release_values' dropout rate): where the unmask
    at t (server.group_unmask = 'threshold') is admitted."""
    section = SecAggSection()
    dropout = release_values(g, r)["secagg.dropout_rate"]
    try:
        threat = ThreatModel(section.adversarial_rate, dropout, section.threat)
        return find_parameters(g, threat).complete
    except ValueError:  # no threshold at all: the run itself says why
        return False


def p90_latency(s: Setup, seed: int, rounds: int, clients: int) -> float:
    """The 90th percentile of the training latencies the availability model draws for
    this seed's population over `rounds` rounds: sync_deadline's round_timeout."""
    model = AvailabilityModel(
        seed=seed, latency_median=s.latency_median, latency_sigma=1.0, latency_client_sigma=0.5
    )
    cids = list(range(clients))
    draws = [model.latency(r, Kind.TRAIN.value, cids) for r in range(1, rounds + 1)]
    return float(np.percentile(np.concatenate(draws), 90))


def contender_values(name: str, s: Setup, seed: int, out: Path) -> dict[str, Any]:
    """The config of one contender (dotted keys, as `--set` takes them)."""
    c, k = s.concurrency, s.buffer
    values: dict[str, Any] = {
        **s.base,
        "seed": seed,
        "out": str(out),
        "simulation.latency_median": s.latency_median,
        "simulation.latency_sigma": 1.0,
        "simulation.latency_client_sigma": 0.5,
        "simulation.plots": False,  # drawn by the bench, outside the measured process
    }
    if name.startswith("sync"):
        values.update({"server.per_round": c, "server.rounds": max(1, s.max_updates // c)})
        if name == "sync_deadline":
            values["server.round_timeout"] = deadline(s, seed)
        return values
    values.update(
        {
            "server.mode": "async",
            "server.concurrency": c,
            "server.buffer": k,
            "server.rounds": max(1, s.max_updates // k),
            "eval.central_every": max(1, c // k),
        }
    )
    if name.startswith("async_secagg"):
        whole = name == "async_secagg_whole"
        values.update(
            {
                "secagg.enabled": True,
                "server.group_size": k if whole else s.group_size,
                "simulation.message_latency_share": s.message_latency_share,
            }
        )
        if s.release_at and not whole:
            values.update(release_values(s.group_size, s.release_at))
        if s.dispatch_at and not whole:
            values["server.group_dispatch_at"] = s.dispatch_at
            if s.member_model != "dispatch":
                values["server.group_member_model"] = s.member_model
            if s.start_order != "client_id":
                values["server.group_start_order"] = s.start_order
        if s.unmask != "survivors" and not whole:
            values["server.group_unmask"] = s.unmask
        if s.group_deadline:  # stragglers past it are dropped; the sum comes by recovery
            values["server.round_timeout"] = deadline(s, seed)
    return values


def release_values(g: int, r: int) -> dict[str, Any]:
    """A group of G released at its first R: the threat model's dropout rate covers the
    G - R members left out by design (the config refuses less), and at least the default."""
    dropout = max(DEFAULT_DROPOUT_RATE, math.ceil((g - r) / g * 1e4) / 1e4)
    return {"server.group_release_at": r, "secagg.dropout_rate": dropout}


def deadline(s: Setup, seed: int) -> float:
    """sync_deadline's round_timeout: the p90 training latency of this seed's clients."""
    rounds = max(1, s.max_updates // s.concurrency)
    clients = int(s.base.get("data.num_clients", 100))
    return round(p90_latency(s, seed, rounds, clients), 6)


def run_contender(values: dict[str, Any], target: float, work: Path) -> dict[str, Any]:
    """One contender in a fresh process (async_contender.py); its records and its CPU
    seconds (children too)."""
    return run_contender_process(
        "fedveil.benchmarks.async_contender", {"values": values, "target": target}, work
    )


def applied_updates(rows: list[dict[str, Any]]) -> int:
    """Client updates that reached the model: async lists each one's staleness; a sync
    round aggregated its cohort_aggregated."""
    total = 0
    for row in rows:
        taus = row.get("staleness")
        total += len(taus) if isinstance(taus, list) else int(row.get("cohort_aggregated") or 0)
    return total


def mean_of(lists: Iterable[Any]) -> float | None:
    """The mean of the numbers in the lists (None entries skipped); None with none."""
    values = [float(v) for xs in lists if isinstance(xs, list) for v in xs]
    return sum(values) / len(values) if values else None


def measure(done: dict[str, Any], target: float) -> dict[str, Any]:
    rows = done["records"]
    updates = applied_updates(rows)
    taus = staleness_values(rows)
    return {
        "time_to_target_s": time_to_target(rows, target),
        "versions": len(rows),
        "client_updates": updates,
        "cpu_s": round(done["cpu_s"], 2),
        "cpu_per_update_s": done["cpu_s"] / updates if updates else None,
        "wall_s": round(done["process_wall_s"], 1),
        "final_accuracy": next(
            (r["test_accuracy"] for r in reversed(rows) if r.get("test_accuracy") is not None),
            None,
        ),
        "mean_staleness": sum(taus) / len(taus) if taus else None,
        # server.group_member_model = 'start': each contributor's own model's staleness
        # (mean_staleness is the weight's, the oldest member's); None otherwise
        "mean_member_staleness": mean_of(r.get("member_staleness") for r in rows),
        "stale_dropped": sum(int(r.get("stale_dropped") or 0) for r in rows),
    }


def summarize(s: Setup, per_seed: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    med = medians(per_seed, names, ("time_to_target_s", "cpu_per_update_s", "mean_staleness"))
    t = {name: med[name]["time_to_target_s"] for name in names}
    cpu = {name: med[name]["cpu_per_update_s"] for name in names}
    ratios = {
        "time_to_target_ratio": ratio(t.get("sync"), t.get("async")),
        "time_to_target_ratio_deadline": ratio(t.get("sync_deadline"), t.get("async")),
        "cpu_per_update_ratio": ratio(cpu.get("async"), cpu.get("sync")),
        "secagg_overhead_ratio": ratio(t.get("async_secagg"), t.get("async")),
        "secagg_whole_overhead_ratio": ratio(t.get("async_secagg_whole"), t.get("async")),
    }
    met = {
        key: (value >= bound if op == ">=" else value <= bound)
        for key, (op, bound) in TARGETS.items()
        if (value := ratios[key]) is not None
    }
    return {
        **ratios,
        "target_accuracy": s.target,
        "medians": med,
        "targets": {k: f"{op} {b:g}" for k, (op, b) in TARGETS.items()},
        "targets_met": met,
        "peer": PEER,
    }


def bench(s: Setup, seeds: list[int], names: list[str], out: Path) -> dict[str, Any]:
    configs: dict[str, Any] = {}

    def measure_one(name: str, seed: int) -> dict[str, Any]:
        values = contender_values(name, s, seed, out / f"seed{seed}" / name)
        configs.setdefault(name, values)
        done = run_contender(values, s.target, out / f"seed{seed}" / name / "bench")
        return measure(done, s.target)

    per_seed = run_seeds(seeds, names, measure_one, progress=out / "progress.json")
    summary = summarize(s, per_seed, names)
    summary.update(
        per_seed=per_seed,
        configs=configs,
        concurrency=s.concurrency,
        buffer=s.buffer,
        group_size=s.group_size,
        release_at=s.release_at,
        dispatch_at=s.dispatch_at,
        member_model=s.member_model,
        start_order=s.start_order,
        unmask=s.unmask,
        latency_median_s=s.latency_median,
        latency_sigma=1.0,
        latency_client_sigma=0.5,
        message_latency_share=s.message_latency_share,
        round_timeout_s={str(seed): deadline(s, seed) for seed in seeds},
        group_deadline=s.group_deadline,
        seeds=seeds,
        load_average=[round(x, 2) for x in os.getloadavg()],
        plots=draw_plots(out, seeds[0], names, s.target),
        out=str(out),
    )
    return summary


def draw_plots(out: Path, seed: int, names: list[str], target: float) -> list[str]:
    """accuracy_over_time.png (every contender of the first seed) in `out`, and each
    contender's own run plots in its run directory (async: staleness, in flight)."""
    from fedveil.simulations.plots import read_metrics, save_plots

    written = []
    runs = {}
    for name in names:
        run_dir = out / f"seed{seed}" / name
        written += [str(p) for p in save_plots(run_dir)]
        runs[LABELS[name]] = read_metrics(run_dir)
    fig = accuracy_over_time(runs, target)
    if fig is not None:
        path = out / "accuracy_over_time.png"
        fig.savefig(path)
        written.insert(0, str(path))
    return written


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def format_report(summary: dict[str, Any]) -> str:
    med = summary["medians"]
    lines = [
        f"fedveil bench async: C = {summary['concurrency']} in flight, K = {summary['buffer']}, "
        f"secagg groups of G = {summary['group_size']} released at R = "
        f"{summary['release_at'] or summary['group_size']}, dispatched with S = "
        f"{summary['dispatch_at'] or summary['group_size']} slots free (whole: G = K, "
        "at once); "
        "latency log-normal, median "
        f"{summary['latency_median_s']:g} s, sigma 1.0, client sigma 0.5 (secagg key and "
        f"unmask stages x {summary['message_latency_share']:g}); "
        f"seeds {summary['seeds']}; target accuracy {summary['target_accuracy']:g}",
        f"{'contender':>38} {'time to target (sim s)':>22} {'CPU s / update':>15} {'mean tau':>9}",
    ]
    for name, m in med.items():
        lines.append(
            f"{LABELS[name]:>38} {_fmt(m['time_to_target_s'], '.1f'):>22} "
            f"{_fmt(m['cpu_per_update_s'], '.4f'):>15} {_fmt(m['mean_staleness'], '.2f'):>9}"
        )
    peer = summary["peer"]
    for key, bound in summary["targets"].items():
        met = summary["targets_met"].get(key)
        verdict = "n/a" if met is None else ("met" if met else "NOT met")
        lines.append(f"{key}: {_fmt(summary[key], '.2f')} (target {bound}: {verdict})")
    lines.append(
        f"peer: {peer['name']} reports time_to_target_ratio ~{peer['time_to_target_ratio']:g}x; "
        f"ours {_fmt(summary['time_to_target_ratio'], '.2f')}x"
    )
    lines.append(f"load average {summary['load_average']}; plots: {', '.join(summary['plots'])}")
    return "\n".join(lines)


def cmd_bench_async(args: argparse.Namespace) -> int:
    unknown = set(args.contenders or ()) - set(ASYNC_CONTENDERS)
    if unknown:
        raise ValueError(
            f"--contenders: unknown {sorted(unknown)}; choose from {', '.join(ASYNC_CONTENDERS)}"
        )
    s = resolve(args)
    names = args.contenders or list(ASYNC_CONTENDERS)
    seeds = [args.seed + i for i in range(args.seeds or (1 if args.quick else 3))]
    summary = bench(s, seeds, names, Path(args.out).resolve())
    print_report(summary, format_report(summary), args.json)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_async`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_async",
        description=ASYNC_SUMMARY,
        add_arguments=add_async_arguments,
        run=cmd_bench_async,
    )


if __name__ == "__main__":
    sys.exit(main())
