"""Where a simulation round's CPU goes: one in-process lane against the bare loop, in one process.

The workload is `fedveil bench simulation`'s (bench_workload.py): the 101,770-parameter
MLP, 100 examples per client, batch 32, one epoch; vmap units of 32 clients. Both
contenders run on one torch thread in this process, alternating, so load on the machine
falls on both alike; the figure is CPU seconds per round (mean of rounds 2..R of
each run, then the median over runs), less load-sensitive than wall time.

    .venv/bin/python scripts/profile_sim_round.py compare --runs 5
    .venv/bin/python scripts/profile_sim_round.py floor --runs 5  # and training, products alone
    .venv/bin/python scripts/profile_sim_round.py sweep --runs 5 --units 1,2,4,8,16,32,50
                                    # a round's training alone against unit size
    .venv/bin/python scripts/profile_sim_round.py backward --runs 11  # written out vs autograd
    .venv/bin/python scripts/profile_sim_round.py budget --runs 5 # a round's CPU by phase
    .venv/bin/python scripts/profile_sim_round.py workers --runs 5 # the worker pool's round
                                    # against one lane: driver, IPC, idle, imbalance
    .venv/bin/python scripts/profile_sim_round.py cprofile     # the lane, by function (CPU)
    .venv/bin/python scripts/profile_sim_round.py ops          # the lane, by torch op
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable

import torch

from fedveil.benchmarks.bench_simulation import run_ours
from fedveil.benchmarks.bench_workload import Workload, run_bare
from fedveil.benchmarks.harness import int_list
from fedveil.simulations.workers import ExchangeStats


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


def training_only(w: Workload, unit: int, *, by_hand: bool = True) -> Callable[[], None]:
    """A round's local training alone: the cohort in vmap units, no engine around it."""
    from torch.nn import functional

    from fedveil.benchmarks.bench_workload import SyntheticPool, mlp
    from fedveil.client.runtime import client_generator
    from fedveil.client.training import LocalTraining
    from fedveil.flat_model import FlatModel
    from fedveil.simulations.batched import BatchedTrainer

    pool = SyntheticPool(w)
    model = FlatModel(mlp())
    trainer = BatchedTrainer(model, functional.cross_entropy)
    trainer._by_hand = by_hand  # False: autograd over the written-out forward (backward mode)
    hp = LocalTraining(batch_size=w.batch_size, lr=w.lr)
    start = model.get()

    def run() -> None:
        for a in range(0, w.per_round, unit):
            cids = range(a, min(w.per_round, a + unit))
            gens = [client_generator(w.seed, 1, c) for c in cids]
            trainer.train(start, [pool(c) for c in cids], hp, gens)

    return run


def products_only(w: Workload, unit: int) -> Callable[[], None]:
    """The matrix products a round's training needs and nothing else: per step and unit,
    the two layers' forward products and the backward ones (no input gradient for the
    first layer), batched as the trainer batches them."""
    d_in, hidden, classes = 784, 128, 10
    w1, w2 = torch.randn(unit, d_in, hidden), torch.randn(unit, hidden, classes)
    x = torch.randn(unit, w.examples, d_in)

    def run() -> None:
        for _ in range(0, w.per_round, unit):
            for start in range(0, w.examples, w.batch_size):
                xb = x[:, start : start + w.batch_size]
                h = torch.bmm(xb, w1).relu_()
                out = torch.bmm(h, w2)
                g2 = torch.bmm(h.transpose(1, 2), out)  # second layer's weight gradient
                gh = torch.bmm(out, w2.transpose(1, 2))  # its input gradient
                torch.bmm(xb.transpose(1, 2), gh)  # first layer's weight gradient
                del g2

    return run


def cpu_of(fn: Callable[[], None]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def floor(w: Workload, runs: int, unit: int) -> dict:
    """compare() plus the round's training alone and its matrix products alone, all
    alternating in this process: how far the lane is from its arithmetic."""
    train, products = training_only(w, unit), products_only(w, unit)
    train()
    products()
    out = compare(w, runs)
    t = [statistics.median(cpu_of(train) for _ in range(3)) for _ in range(runs)]
    m = [statistics.median(cpu_of(products) for _ in range(3)) for _ in range(runs)]
    out.update(training=statistics.median(t), products=statistics.median(m))
    for key in ("lane", "training", "products"):
        out[f"{key}_over_bare"] = out[key] / out["bare"]
    return out


def sweep(w: Workload, runs: int, units: list[int]) -> dict:
    """A round's training alone for each unit size (clients per vmap unit), alternating
    with the bare loop in this process: where the lane's CPU per client is lowest."""
    trains = {u: training_only(w, u) for u in units}
    for run in trains.values():
        run()
    bare: list[float] = []
    per_unit: dict[int, list[float]] = {u: [] for u in units}
    for r in range(runs):
        bare.append(steady_cpu(run_bare(w)))
        order = units[r % len(units) :] + units[: r % len(units)]  # no unit always first
        for u in order:
            per_unit[u].append(statistics.median(cpu_of(trains[u]) for _ in range(3)))
    b = statistics.median(bare)
    out: dict = {"bare": b, "bare_cpu_s": bare}
    for u in units:
        m = statistics.median(per_unit[u])
        out[f"unit_{u}"] = {
            "cpu_s": m,
            "over_bare": m / b,
            "ms_per_client": 1000 * m / w.per_round,
            "runs": per_unit[u],
        }
    return out


def backward(w: Workload, runs: int, unit: int) -> dict:
    """A round's training with the written-out backward against autograd over the same
    forward, alternating (each sample the mean of 3 rounds), medians of `runs`."""
    paths = {"by_hand": training_only(w, unit), "autograd": training_only(w, unit, by_hand=False)}
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(runs):
        for name in sorted(paths, reverse=r % 2 == 1):  # neither always first
            run = paths[name]
            samples[name].append(statistics.fmean(cpu_of(run) for _ in range(3)))
    out = {f"{name}_ms": 1000 * statistics.median(v) for name, v in samples.items()}
    out["by_hand_over_autograd"] = out["by_hand_ms"] / out["autograd_ms"]
    return out


def budget(w: Workload, runs: int, unit: int) -> dict:
    """A round's CPU by phase, each phase timed alone at the round's shapes (CPU ms a
    round of `per_round` clients, median of `runs`), next to the round's training and the
    bare loop's round, and the bare loop's own matrix products (one client's model, batch
    by batch): the floor each side's arithmetic sets."""
    d_in, hidden, classes = 784, 128, 10
    sizes = [min(w.batch_size, w.examples - a) for a in range(0, w.examples, w.batch_size)]
    units = -(-w.per_round // unit)
    w1 = torch.randn(unit, d_in, hidden)
    g1 = torch.empty_like(w1)
    xs = torch.randn(unit, w.examples, d_in)
    h = torch.randn(unit, w.batch_size, hidden)
    g = torch.randn(unit, w.batch_size, hidden)
    start = torch.randn(hidden, d_in)
    deltas = torch.empty(unit, hidden, d_in)
    flat = [torch.randn(unit, 101_770)]
    grads = [torch.randn(unit, 101_770)]
    w2 = torch.randn(unit, hidden, classes)
    one_w1, one_x, one_g = torch.randn(d_in, hidden), xs[0], g[0]

    def per_step(fn: Callable[[int], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(units):
                for size in sizes:  # the epoch's batches: a short last one
                    fn(size)

        return run

    phases: dict[str, Callable[[], None]] = {
        "forward_product_layer1": per_step(lambda s: torch.bmm(xs[:, :s], w1)),
        "weight_gradient_layer1": per_step(
            lambda s: torch.bmm(xs[:, :s].transpose(1, 2), g[:, :s], out=g1)
        ),
        "sgd_update": per_step(lambda s: torch._foreach_add_(flat, grads, alpha=-0.05)),
        "products_layer2": per_step(
            lambda s: (torch.bmm(h[:, :s], w2), torch.bmm(h[:, :s].transpose(1, 2), h[:, :s, :10]))
        ),
        "delta_transposed": lambda: [
            torch.sub(w1.transpose(1, 2), start, out=deltas) for _ in range(units)
        ],
        "bare_products_layer1": lambda: [
            (torch.mm(one_x[:s], one_w1), torch.mm(one_x[:s].t(), one_g[:s]))
            for _ in range(w.per_round)
            for s in sizes
        ],
    }
    train = training_only(w, unit)
    train()
    out: dict = {"unit": unit, "batches": sizes}
    samples: dict[str, list[float]] = {k: [] for k in (*phases, "training", "bare_round")}
    for _ in range(runs):
        samples["bare_round"].append(steady_cpu(run_bare(w)))
        samples["training"].append(cpu_of(train))
        for name, fn in phases.items():
            samples[name].append(cpu_of(fn))
    for name, values in samples.items():
        out[f"{name}_ms"] = 1000 * statistics.median(values)
    return out


def exchange_rows(st: ExchangeStats) -> dict:
    """One exchange's timeline, in seconds from the pool's `run` being called."""
    n = st.workers
    mine = [[c for c in st.chunks if c.worker == i] for i in range(n)]
    busy = [sum(c.ended - c.started for c in cs) for cs in mine]
    first = [min((c.started for c in cs), default=st.finished) for cs in mine]
    last = [max((c.ended for c in cs), default=st.begun) for cs in mine]
    gaps = []  # per worker: waiting between its chunks (for work from the server)
    for cs in mine:
        spans = sorted((c.started, c.ended) for c in cs)
        gaps.append(sum(max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(spans)))
    return {
        "exchange_s": st.finished - st.begun,
        "pack_requests_s": st.packed - st.begun,
        "hop_to_worker_s": statistics.median(c.started - c.sent for c in st.chunks),
        "hop_back_s": statistics.median(c.received - c.ended for c in st.chunks),
        "copy_out_s": sum(c.copied - c.received for c in st.chunks),
        "tail_s": st.finished - max(c.ended for c in st.chunks),
        "finish_gap_s": max(last) - min(last),
        "clients": [sum(c.clients for c in cs) for cs in mine],
        "busy_s": busy,
        "worker_cpu_s": [sum(c.cpu_s for c in cs) for cs in mine],
        "idle_before_s": [f - st.begun for f in first],
        "idle_between_s": gaps,
        "idle_after_s": [st.finished - t for t in last],
        "request_bytes": st.request_bytes,
        "reply_bytes": sum(c.reply_bytes for c in st.chunks),
    }


def workers(w: Workload, runs: int, pool: int) -> dict:
    """The worker pool's round against one lane's, alternating (medians over the steady
    rounds of `runs` runs each): where the wall time goes that one lane does not have.

    - `lane_s`, `lane_cpu_s`: one in-process lane's round; `ideal_s` = its CPU / pool
      size, the round with perfect scaling and no overhead; `over_ideal_s` the rest;
    - `round_s`, `round_cpu_s`: the pool's round (the engine's duration; CPU of the
      process tree); `outside_exchange_s` = round - exchange: the server's serial work
      while every worker waits (cohort, requests, units, what is left of the sum after
      the last reply, the server's update);
    - in the exchange: packing the model (`pack_requests_s`), the pipe hops to a worker
      and back (medians per chunk), copying replies out of shared memory (`copy_out_s`,
      the server's, a round), `tail_s` from the last chunk's end to the exchange's;
    - per worker: clients, busy (its chunks), CPU, and idle before its first chunk,
      between chunks and after its last (`finish_gap_s`: the first to finish waits
      that long for the last); `driver_cpu_s` = tree CPU - the workers' chunks' CPU;
    - `request_bytes`, `reply_bytes`: what crosses shared memory a round.
    """
    lane_wall: list[float] = []
    lane_cpu: list[float] = []
    rows: list[dict] = []
    for _ in range(runs):
        r1 = run_ours(w, 1)
        lane_wall += r1["round_s"][1:]
        lane_cpu += r1["round_cpu_s"][1:]
        stats: list[ExchangeStats] = []
        rp = run_ours(w, pool, on_exchange=stats.append)
        # One exchange a round (training; no central evaluation in this workload).
        for wall, cpu, st in list(zip(rp["round_s"], rp["round_cpu_s"], stats, strict=True))[1:]:
            row = exchange_rows(st)
            row.update(
                round_s=wall,
                round_cpu_s=cpu,
                outside_exchange_s=wall - row["exchange_s"],
                driver_cpu_s=cpu - sum(row["worker_cpu_s"]),
            )
            rows.append(row)
    med = statistics.median
    out: dict = {
        "workers": pool,
        "steady_rounds": len(rows),
        "lane_s": med(lane_wall),
        "lane_cpu_s": med(lane_cpu),
        "ideal_s": med(lane_cpu) / pool,
    }
    for key in rows[0]:
        if isinstance(rows[0][key], list):
            out[key] = [med(r[key][i] for r in rows) for i in range(pool)]
        else:
            out[key] = med(r[key] for r in rows)
    out["over_ideal_s"] = out["round_s"] - out["ideal_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "mode",
        choices=["compare", "floor", "sweep", "backward", "budget", "workers", "cprofile", "ops"],
    )
    p.add_argument(
        "--unit", type=int, default=25, help="clients per vmap unit (floor, backward, budget) [25]"
    )
    p.add_argument(
        "--units",
        type=int_list,
        default=[1, 2, 4, 8, 16, 32, 50],
        help="unit sizes (sweep) [1,2,4,8,16,32,50]",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=5,
        help="runs of each contender (compare, floor, sweep, backward, budget, workers) [5]",
    )
    p.add_argument("--workers", type=int, default=2, help="worker processes (workers) [2]")
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
    elif args.mode == "floor":
        print(json.dumps(floor(w, args.runs, args.unit)))
    elif args.mode == "sweep":
        print(json.dumps(sweep(w, args.runs, args.units)))
    elif args.mode == "backward":
        print(json.dumps(backward(w, args.runs, args.unit)))
    elif args.mode == "budget":
        print(json.dumps(budget(w, args.runs, args.unit)))
    elif args.mode == "workers":
        print(json.dumps(workers(w, args.runs, args.workers)))
    elif args.mode == "cprofile":
        prof = cProfile.Profile(time.process_time)  # CPU time: less load-sensitive than wall
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
