"""Where a simulation round's CPU goes: one in-process lane against the bare loop, in one process.

The workload is `fedveil bench simulation`'s (bench_workload.py): the 101,770-parameter
MLP, 100 examples per client, batch 32, one epoch; vmap units of 32 clients. Both
contenders run on one torch thread in this process, alternating, so load on the machine
falls on both alike; the figure is CPU seconds per round (mean of rounds 2..R of
each run, then the median over runs), less load-sensitive than wall time.

    .venv/bin/python scripts/profile_sim_round.py compare --runs 5
    .venv/bin/python scripts/profile_sim_round.py cprofile     # the lane, by function
    .venv/bin/python scripts/profile_sim_round.py ops          # the lane, by torch op
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys

import torch

from fedveil.benchmarks.bench_simulation import run_ours
from fedveil.benchmarks.bench_workload import Workload, run_bare


def steady_cpu(result: dict) -> float:
    # The mean of rounds 2..R: CPU clocks tick in 10 ms, a round is ~0.2 s.
    cpu = result["round_cpu_s"]
    return statistics.fmean(cpu[1:] if len(cpu) > 1 else cpu)


def compare(w: Workload, runs: int) -> dict:
    bare: list[float] = []
    lane: list[float] = []
    for _ in range(runs):
        bare.append(steady_cpu(run_bare(w)))
        lane.append(steady_cpu(run_ours(w, 1)))
    b, o = statistics.median(bare), statistics.median(lane)
    return {"bare_cpu_s": bare, "lane_cpu_s": lane, "bare": b, "lane": o, "lane_over_bare": o / b}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=["compare", "cprofile", "ops"])
    p.add_argument("--runs", type=int, default=5, help="runs of each contender (compare) [5]")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--clients", type=int, default=500)
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    w = Workload(clients=args.clients, per_round=args.per_round, rounds=args.rounds)
    run_ours(Workload(clients=args.clients, per_round=args.per_round, rounds=1), 1)  # warm up
    if args.mode == "compare":
        print(json.dumps(compare(w, args.runs)))
    elif args.mode == "cprofile":
        prof = cProfile.Profile()
        prof.runcall(run_ours, w, 1)
        stats = pstats.Stats(prof, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run_ours(w, 1)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
