"""`fedveil bench simulation`: fedveil's engine against Flower's simulation and a bare loop.

Each contender runs the same workload (bench_workload.py) in a fresh child
process, one after another in the same invocation; this process measures
the child's whole life (end to end) and samples the peak memory of its
process tree (Ray's processes and fedveil's workers included). Children
report their per-round times and when their first round started.

Steady per-round time is the median over rounds 2..R (round 1 warms up).
`ratio` is the peer's steady round time over ours; `bare_ratio` ours over the
bare loop's.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedveil.benchmarks import run_directory
from fedveil.benchmarks.bench_workload import Workload
from fedveil.benchmarks.harness import command_main, int_list, print_report, run_contender
from fedveil.benchmarks.memwatch import RoundClock

if TYPE_CHECKING:
    from fedveil.config import RunConfig
    from fedveil.simulations.workers import ExchangeStats


# -- children: one contender each (simulation_contender.py) -------------------
def run_ours(
    w: Workload,
    workers: int,
    *,
    run_dir: Path | None = None,
    on_exchange: Callable[[ExchangeStats], None] | None = None,
) -> dict[str, Any]:
    """The workload through fedveil's run lifecycle, as `fedveil simulate` runs it: the
    round engine over the in-process transport, writing its run directory (`run_dir`;
    None: a temporary folder). `on_exchange`: the worker pool's timings per exchange
    (scripts/profile_sim_round.py workers)."""
    # Imported here: the other contenders' children do not pay for fedveil's engine.
    from fedveil.benchmarks.bench_workload import BenchTaskFactory, bench_task
    from fedveil.server.engine.lifecycle import RunLifecycle
    from fedveil.server.engine.runstore import RunStore
    from fedveil.simulations.inprocess import InProcessTransport, auto_workers

    cfg = ours_config(w)
    task = bench_task(w)
    workers = workers or auto_workers("cpu")
    clock = RoundClock()
    with run_directory(run_dir) as out:
        run = RunLifecycle(cfg, task, RunStore(out))
        with InProcessTransport(
            task,
            "cpu",
            workers=workers,
            unit_size=cfg.simulation.vmap_clients,
            task_factory=BenchTaskFactory(w),
            run_config=cfg,
            on_exchange=on_exchange,
        ) as transport:
            engine = run.engine(transport, on_round=lambda _record: clock.mark(), resume=False)
            clock.mark()
            summary = engine.run()
        run.finish(engine, summary, model_metadata={"task": task.name})
    return {
        **clock.result(),
        # The engine's own round time: the run directory's fsynced metrics line and
        # checkpoint after each round (15-90 ms on a shared disk; the peer writes none)
        # count in CPU time, start-up and end to end, not in the round.
        "round_s": [r.duration_s for r in engine.history],
        "train_loss": [r.train_loss for r in engine.history],
        "workers": workers,
        "vmap_clients": cfg.simulation.vmap_clients,
    }


def ours_config(w: Workload) -> RunConfig:
    """The workload as a run config: no central evaluation, so rounds are training only.

    The training is the bare loop's and the Flower peer's (bench_workload.local_epoch):
    plain SGD on the clients (no momentum, no weight decay: set here, since the run
    config's defaults are the default job's) and plain FedAvg on the server.
    """
    from fedveil.config import load_config

    return load_config(
        None,
        {
            "seed": w.seed,
            "data.num_clients": w.clients,
            "model.name": "mlp",
            "server.rounds": w.rounds,
            "server.per_round": w.per_round,
            "server.optimizer": "fedavg",
            "server.server_lr": 1.0,
            "client.local_epochs": 1,
            "client.local_steps": 0,
            "client.batch_size": w.batch_size,
            "client.lr": w.lr,
            "client.momentum": 0.0,
            "client.weight_decay": 0.0,
            "client.prox_mu": 0.0,
            "eval.central_every": 0,
        },
    )


def contender(spec: dict[str, Any]) -> dict[str, Any]:
    """A contender's process (simulation_contender.py): spec {"role", "workload",
    "workers"}."""
    role, w, workers = spec["role"], Workload(**spec["workload"]), int(spec["workers"])
    if role == "ours":
        return run_ours(w, workers)
    if role == "ours_1":
        # One in-process lane on one torch thread: the engine's overhead over the bare loop.
        import torch

        torch.set_num_threads(1)
        return run_ours(w, 1)
    if role == "bare":
        from fedveil.benchmarks.bench_workload import run_bare

        return run_bare(w)
    if role == "flower":
        from fedveil.benchmarks.flower_peer import run_flower

        return run_flower(w)
    raise ValueError(f"unknown role {role!r}")


# -- the parent: runs and measures the children -------------------------------
def measure(role: str, w: Workload, workers: int = 0, timeout_s: float = 3600) -> dict[str, Any]:
    """Run one contender in a child process; its times, end-to-end time and peak memory."""
    with run_directory(None) as work:
        result = run_contender(
            "fedveil.benchmarks.simulation_contender",
            {"role": role, "workload": w.to_dict(), "workers": workers},
            work,
            timeout_s=timeout_s,
            watch_memory=True,
        )
    rounds = result["round_s"]
    steady = slice(1, None) if len(rounds) > 1 else slice(None)
    result.update(
        role=role,
        round_s_median=statistics.median(rounds[steady]),
        round_cpu_s_median=statistics.median(result["round_cpu_s"][steady]),
        first_round_s=rounds[0],
        startup_s=result.pop("first_round_at") - result["launched_at"],
        end_to_end_s=result["process_wall_s"],
    )
    return result


def machine() -> dict[str, str]:
    """What a figure depends on besides the code: the torch build and the CPU (the bare
    loop's round fell 3.6x between two runs of the same code, and neither was recorded)."""
    import platform

    import torch

    model = platform.processor() or "n/a"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
            )
    except OSError:
        pass
    return {"torch_version": torch.__version__, "cpu_model": model}


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


SUMMARY_KEYS = (
    "round_s_median",
    "round_cpu_s_median",
    "first_round_s",
    "startup_s",
    "end_to_end_s",
    "peak_rss_mb",
    "end_pss_mb",
)


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's repeated runs: the median of each figure, and every run kept."""
    out = dict(runs[-1])
    for key in SUMMARY_KEYS:
        out[key] = statistics.median(r[key] for r in runs)
    out["repeats"] = [{k: r[k] for k in SUMMARY_KEYS} for r in runs]
    return out


def bench(w: Workload, *, peer: str | None, workers: int = 0, repeat: int = 1) -> dict[str, Any]:
    """Bare loop, ours (one lane, then all cores) and the peer, round-robin `repeat` times.

    Running them in turn, repeatedly, spreads any other load on the machine over all
    of them; each figure is the median over the repeats.
    """
    if repeat < 1:
        raise ValueError(f"--repeat = {repeat}: must be >= 1")
    load_before = load_average()
    roles = [("bare", 0), ("ours_1", 1), ("ours", workers)]
    if peer == "flower":
        roles.append(("flower", 0))
    runs: dict[str, list[dict[str, Any]]] = {role: [] for role, _ in roles}
    for _ in range(repeat):
        for role, n in roles:
            runs[role].append(measure(role, w, n))
    results = {role: combine(r) for role, r in runs.items()}
    ours, bare = results["ours"], results["bare"]
    summary: dict[str, Any] = {
        "workload": w.to_dict(),
        "cpu_cores": os.cpu_count(),
        **machine(),
        "repeat": repeat,
        "load_before": load_before,
        "load_after": load_average(),
        "results": results,
        "bare_ratio": ours["round_s_median"] / bare["round_s_median"],
        "sequential_ratio": results["ours_1"]["round_s_median"] / bare["round_s_median"],
        "bare_cpu_ratio": _ratio(ours["round_cpu_s_median"], bare["round_cpu_s_median"]),
    }
    if "flower" in results:
        peer_r = results["flower"]
        summary["ratio"] = peer_r["round_s_median"] / ours["round_s_median"]
        summary["cpu_ratio"] = _ratio(peer_r["round_cpu_s_median"], ours["round_cpu_s_median"])
        summary["end_to_end_ratio"] = peer_r["end_to_end_s"] / ours["end_to_end_s"]
        summary["startup_ratio"] = peer_r["startup_s"] / ours["startup_s"]
    return summary


def _ratio(numerator: float, denominator: float) -> float:
    """A CPU-time ratio; process CPU clocks tick in 10 ms, so a tiny workload can read 0."""
    return numerator / denominator if denominator > 0 else math.nan


def bench_population(
    w: Workload, populations: list[int], *, workers: int = 0, repeat: int = 1
) -> dict[str, Any]:
    """Ours at a fixed cohort size as the population grows: peak memory should stay flat."""
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in populations}
    for _ in range(repeat):
        for n in populations:
            runs[n].append(measure("ours", replace(w, clients=n), workers))
    rows = []
    for n in populations:
        r = combine(runs[n])
        rows.append({"clients": n, **{k: r[k] for k in _POP_KEYS}})
    rss = [row["peak_rss_mb"] for row in rows]
    pss = [row["end_pss_mb"] for row in rows]
    return {
        "workload": w.to_dict(),
        "load_after": load_average(),
        "population": rows,
        "memory_growth": max(rss) / min(rss),  # peak RSS of the tree, largest / smallest
        "memory_growth_pss": max(pss) / min(pss),
    }


_POP_KEYS = ("round_s_median", "startup_s", "end_to_end_s", "peak_rss_mb", "end_pss_mb")


def format_report(summary: dict[str, Any]) -> str:
    w = summary["workload"]
    lines = [
        f"workload: {w['clients']} clients, {w['per_round']} per round, {w['rounds']} rounds, "
        f"{w['examples']} examples/client, MLP 784-128-10, batch {w['batch_size']}, 1 epoch",
        f"machine: {summary['cpu_cores']} cores ({summary.get('cpu_model', 'n/a')}), torch "
        f"{summary.get('torch_version', 'n/a')}, load average {summary['load_before']} before, "
        f"{summary['load_after']} after; medians of {summary['repeat']} run(s) each",
        "",
        f"{'':8}{'round (median)':>16}{'CPU/round':>11}{'first round':>13}{'start-up':>10}"
        f"{'end to end':>12}{'peak RSS':>11}{'PSS at end':>12}",
    ]
    for name, r in summary["results"].items():
        lines.append(
            f"{name:8}{r['round_s_median']:>14.3f} s{r['round_cpu_s_median']:>9.3f} s"
            f"{r['first_round_s']:>11.3f} s{r['startup_s']:>8.2f} s{r['end_to_end_s']:>10.2f} s"
            f"{r['peak_rss_mb']:>8.0f} MB{r['end_pss_mb']:>9.0f} MB"
        )
    lines.append("")
    if "ratio" in summary:
        lines.append(
            f"flower / ours: {summary['ratio']:.1f}x per round "
            f"({summary['cpu_ratio']:.1f}x in CPU time), "
            f"{summary['end_to_end_ratio']:.1f}x end to end, "
            f"{summary['startup_ratio']:.1f}x start-up"
        )
    lines.append(
        f"ours / bare loop: {summary['bare_ratio']:.2f}x per round "
        f"({summary['results']['ours']['workers']} workers; "
        f"{summary['bare_cpu_ratio']:.2f}x in CPU time); "
        f"one in-process lane / bare loop: {summary['sequential_ratio']:.2f}x"
    )
    return "\n".join(lines)


def format_population(summary: dict[str, Any]) -> str:
    lines = [
        f"{'clients':>9}{'round (median)':>16}{'peak RSS':>11}{'PSS at end':>12}",
    ]
    for row in summary["population"]:
        lines.append(
            f"{row['clients']:>9}{row['round_s_median']:>14.3f} s"
            f"{row['peak_rss_mb']:>8.0f} MB{row['end_pss_mb']:>9.0f} MB"
        )
    lines.append(
        f"largest / smallest population: peak RSS {summary['memory_growth']:.3f}x, "
        f"PSS at end {summary['memory_growth_pss']:.3f}x"
    )
    return "\n".join(lines)


SIMULATION_SUMMARY = (
    "Train the same workload (100k-parameter MLP, ~100 generated 28x28 "
    "examples per client, one local epoch, batch 32) with a bare torch loop, with "
    "fedveil's in-process engine and, with --peer flower, with Flower's simulation "
    "engine, each in a fresh process; print per-round time (median of rounds 2..R), "
    "start-up, end-to-end time and peak memory of each process tree, and the ratios."
)


def add_simulation_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench simulation`."""
    p.add_argument("--clients", type=int, default=100, help="population size [100]")
    p.add_argument("--per-round", type=int, help="clients per round [all]")
    p.add_argument("--rounds", type=int, default=5, help="rounds [5]")
    p.add_argument("--peer", choices=["flower"], help="also run the peer framework")
    p.add_argument("--workers", type=int, default=0, help="our worker processes [0: one per core]")
    p.add_argument("--examples", type=int, default=100, help="examples per client [100]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every contender this many times, in turn; report medians [1]",
    )
    p.add_argument(
        "--population",
        type=int_list,
        metavar="N,N,...",
        help="memory mode: ours only, at each population size with --per-round clients "
        "per round; reports how peak memory grows with the population",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def cmd_bench_simulation(args: argparse.Namespace) -> int:
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
        summary = bench_population(w, args.population, workers=args.workers, repeat=args.repeat)
        print_report(summary, format_population(summary), args.json)
    else:
        summary = bench(w, peer=args.peer, workers=args.workers, repeat=args.repeat)
        print_report(summary, format_report(summary), args.json)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_simulation`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_simulation",
        description=SIMULATION_SUMMARY,
        add_arguments=add_simulation_arguments,
        run=cmd_bench_simulation,
    )


if __name__ == "__main__":
    sys.exit(main())
