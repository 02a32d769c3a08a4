"""The canary audit's power and soundness (issue 20, part 1): a deliberately broken
mechanism must be refuted; the correct one must not be, beyond what chance allows.

    .venv/bin/python -m fedveil.benchmarks.bench_audit --json [--seeds 20] [--canaries 1000]
    .venv/bin/python -m fedveil.benchmarks.bench_audit --cost-only --json [--repeat 3]
    python -m fedveil.benchmarks.bench_audit --cost-only --cost-config default --repeat 1 --json

Config: digits, MLP, 20 users, Poisson q = 1, one round, central DP with z = 2.3 (an
accounted epsilon below 2 at delta = 1e-5; q = 1 so the claim needs no amplification).
The broken runs keep the ledger's claim (z = 2.3) while the releases carry the noise
scaled by 1/4, and none (`AuditMechanism`, the harness's declared seam).

The last line of stdout is one JSON object:
  broken_claimed_epsilon                 the ledger's epsilon in the broken runs
  broken_lower_bound                     the audit's lower bound (f-DP, 99%) with the noise cut 4x
  broken_lower_bound_no_noise            ... with the noise off
  broken_estimate, broken_estimate_no_noise
  distributed_claimed_epsilon            the same config under distributed DP (Skellam shares
                                         under secure aggregation, zero-out canaries: held-out
                                         ones take part with a zero update)
  distributed_broken_lower_bound         ... every client's share drawn with 1/4 of the
                                         noise while the ledger claims z
  distributed_correct_lower_bound        ... with the honest shares (one seed)
  correct_max_lower_over_accounted       largest lower bound / accounted epsilon over seeds
  correct_exceedances                    seeds whose lower bound exceeded the claim (chance
                                         allows about 1 in 100 at 99%)
  correct_estimates                      each correct seed's estimate and interval
  audit_cost_ratio                       an audit in the clear (no DP) over the same run's
                                         plain wall time: the fastest of `repeat` audits over
                                         the fastest of as many plain runs, interleaved (on a
                                         shared machine load only ever adds time). The
                                         default job's figure when --cost-config default
                                         measured it, else the small config's
  audit_cost_ratio_config                which of the two audit_cost_ratio is: default|small
  audit_cost_ratio_small                 the small config's ratio (5 rounds of 20 digits
                                         users, a ~0.4 s run: canaries outnumber users 25:1)
  audit_cost_default                     --cost-config default: the same measurement on the
                                         job `fedveil simulate` runs on its defaults
                                         (Fashion-MNIST, CNN, 100 users, 20 per round, 60
                                         rounds, no DP; the audit's cohorts grow with the
                                         canaries), both sides in one process (the audit
                                         always runs its users in-process) without plots
                                         (an audit draws none): ratio, times, config
  audit_cost_ratio_secagg                ... both under secure aggregation
  audit_cost, audit_cost_secagg          each side's times, the median of the pairwise
                                         ratios, the ratio of CPU times (this process's),
                                         and the 1-minute load average before/after
  config, canaries, seeds, wall_s
No peer framework (Flower, NVFlare, TFF, FedML) ships an audit of epsilon: the comparison
is with the accountant's claim itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from fedveil.benchmarks.harness import command_main
from fedveil.config import load_config
from fedveil.simulations.audit import AuditMechanism, run_audit
from fedveil.simulations.simulate_run import simulate


def audit_config(seed: int, out: Path) -> dict[str, Any]:
    return {
        "seed": seed,
        "data.dataset": "digits",
        "data.partition": "iid",
        "model.name": "mlp",
        "data.num_clients": 20,
        "server.rounds": 1,
        "server.sampling": "poisson",
        "server.sample_rate": 1.0,
        "client.local_steps": 1,
        "eval.central_every": 0,
        "device": "cpu",
        "simulation.workers": 1,
        "dp.mechanism": "central",
        "dp.noise_multiplier": 2.3,
        "dp.epsilon": 2.0,
        "out": str(out),
    }


def run_benchmark(
    *,
    seeds: int = 20,
    canaries: int = 1000,
    secagg_cost: bool = True,
    cost_repeat: int = 3,
    distributed: bool = True,
    cost_config: str = "small",
) -> dict[str, Any]:
    """`secagg_cost=False` skips the (slow) cost under secure aggregation: its key is None.
    `cost_config='default'` also costs the audit of the default job (minutes a pair)."""
    start = time.perf_counter()
    result: dict[str, Any] = {"canaries": canaries, "seeds": seeds}
    with tempfile.TemporaryDirectory(prefix="fedveil-audit-") as tmp:
        root = Path(tmp)
        cfg = load_config(None, audit_config(0, root / "run"))
        result["config"] = audit_config(0, Path("runs/audit-bench"))
        for name, scale in (("", 0.25), ("_no_noise", 0.0)):
            got = run_audit(
                cfg, canaries=canaries, out=root / f"broken{name}", mechanism=AuditMechanism(scale)
            )
            result["broken_claimed_epsilon"] = got["accounted_epsilon"]
            result[f"broken_lower_bound{name}"] = got["lower_bound_epsilon"]
            result[f"broken_estimate{name}"] = got["estimated_epsilon"]
            print(f"broken{name or ' (z/4)'}: {got['verdict']}", file=sys.stderr, flush=True)
        if distributed:
            result.update(distributed_audits(root, canaries))
        ratios, estimates, exceed = [], [], 0
        for seed in range(seeds):
            cfg = load_config(None, audit_config(seed, root / f"run-{seed}"))
            got = run_audit(cfg, canaries=canaries, out=root / f"correct-{seed}")
            claim, lower = got["accounted_epsilon"], got["lower_bound_epsilon"]
            ratios.append(lower / claim)
            exceed += lower > claim
            estimates.append(
                {
                    "estimate": got["estimated_epsilon"],
                    "interval": got["estimated_epsilon_interval"],
                }
            )
            print(f"seed {seed}: {got['verdict']}", file=sys.stderr, flush=True)
        result["correct_max_lower_over_accounted"] = max(ratios)
        result["correct_exceedances"] = exceed
        result["correct_estimates"] = estimates
        result["correct_estimate_median"] = statistics.median(e["estimate"] for e in estimates)
        result.update(
            costs(root, canaries, secagg=secagg_cost, repeat=cost_repeat, config=cost_config)
        )
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def distributed_audits(root: Path, canaries: int) -> dict[str, Any]:
    """The audit config under distributed DP: shares cut 4x under the ledger's claim, and
    honest shares."""
    values = {**audit_config(0, root / "drun"), "dp.mechanism": "distributed"}
    cfg = load_config(None, {**values, "secagg.enabled": True})
    result: dict[str, Any] = {}
    for name, scale in (("broken", 0.25), ("correct", 1.0)):
        got = run_audit(
            cfg, canaries=canaries, out=root / f"d-{name}", mechanism=AuditMechanism(scale)
        )
        result["distributed_claimed_epsilon"] = got["accounted_epsilon"]
        result[f"distributed_{name}_lower_bound"] = got["lower_bound_epsilon"]
        result[f"distributed_{name}_estimate"] = got["estimated_epsilon"]
        print(f"distributed {name}: {got['verdict']}", file=sys.stderr, flush=True)
    return result


COST_CONFIGS = ("small", "default")


def costs(
    root: Path, canaries: int, *, secagg: bool, repeat: int, config: str = "small"
) -> dict[str, Any]:
    """audit_cost_ratio[_secagg] and their details (see the module's docstring). `config`:
    'default' also costs the audit of the default job, and audit_cost_ratio is then its."""
    if config not in COST_CONFIGS:
        raise ValueError(f"cost config = {config!r}: must be one of {COST_CONFIGS}")
    result: dict[str, Any] = {}
    for name, on in (("", True), ("_secagg", secagg)):
        cost = cost_ratio(root, canaries, secagg=bool(name), repeat=repeat) if on else None
        result[f"audit_cost_ratio{name}"] = None if cost is None else cost["ratio"]
        result[f"audit_cost{name}"] = cost
    result["audit_cost_ratio_small"] = result["audit_cost_ratio"]
    result["audit_cost_ratio_config"] = "small"
    result["audit_cost_default"] = None
    if config == "default":
        cost = cost_ratio(root, canaries, repeat=repeat, config="default")
        result["audit_cost_default"] = cost
        result["audit_cost_ratio"] = cost["ratio"]
        result["audit_cost_ratio_config"] = "default"
    return result


def cost_ratio(
    root: Path,
    canaries: int,
    *,
    secagg: bool = False,
    repeat: int = 3,
    threads: int = 1,
    config: str = "small",
) -> dict[str, Any]:
    """An audit in the clear (the config without DP) over the plain run's wall time, after
    one untimed run of each (imports, caches), then `repeat` timed pairs, interleaved:
    `ratio` is the fastest audit over the fastest plain run. `secagg`: both under secure
    aggregation, where every sampled canary takes part in the protocol. `threads`: torch's
    intra-op threads for both (1: on a shared 2-core machine two threads' spinning
    barriers multiply the small MLP's training time several-fold whenever anything else
    runs, which hides the audit's own cost; see simulations/inprocess.py). `config`:
    'small' (`cost_config`) or 'default' (`default_cost_config`, minutes a pair: its warm-up
    is a one-round plain run, which loads the data and imports, and no audit)."""
    if repeat < 1:
        raise ValueError(f"repeat = {repeat}: must be >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _timed_pairs(root, canaries, secagg, repeat, config) | {"torch_threads": threads}
    finally:
        torch.set_num_threads(before)


def _timed_pairs(
    root: Path, canaries: int, secagg: bool, repeat: int, config: str = "small"
) -> dict[str, Any]:
    if config == "default":
        values = default_cost_values(root, secagg)
        cfg = load_config(None, values)
        simulate(load_config(None, {**values, "server.rounds": 1}))
    else:
        values = {}
        cfg = cost_config(root, secagg)
        simulate(cfg)
        run_audit(cfg, canaries=canaries, out=root / "cost-warm")
    load_before = os.getloadavg()[0]
    plain, audit, plain_cpu, audit_cpu, timings = [], [], [], [], []
    for i in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        simulate(cfg)
        plain.append(time.perf_counter() - t0)
        plain_cpu.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        timings.append(run_audit(cfg, canaries=canaries, out=root / "cost")["timings_s"])
        audit.append(time.perf_counter() - t0)
        audit_cpu.append(time.process_time() - c0)
        # Progress: a pair of the default job takes minutes.
        print(
            f"cost {config} pair {i + 1}/{repeat}: plain {plain[-1]:.1f} s, audit "
            f"{audit[-1]:.1f} s (cpu {plain_cpu[-1]:.1f} / {audit_cpu[-1]:.1f} s), "
            f"load {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
            flush=True,
        )
    extra = {"config": "default", "overrides": values} if config == "default" else {}
    return extra | {
        "ratio": min(audit) / min(plain),
        "median_pair_ratio": statistics.median(a / p for a, p in zip(audit, plain, strict=True)),
        # This process's CPU time (all its threads): less swayed by other users' load.
        "cpu_ratio": min(audit_cpu) / min(plain_cpu),
        "plain_s": [round(t, 3) for t in plain],
        "audit_s": [round(t, 3) for t in audit],
        "audit_timings_s": timings,  # each audit's directions / run / analysis
        "canaries": canaries,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def cost_config(root: Path, secagg: bool) -> Any:
    """The costed run: the audit config without DP, of ordinary length."""
    values = audit_config(0, root / "plain")
    values = {k: v for k, v in values.items() if not k.startswith("dp.")}
    # A run of ordinary length (local epochs, several rounds): canaries need no training,
    # so their cost is per round and per canary, not per local step.
    values.update({"simulation.plots": False, "server.rounds": 5, "client.local_steps": 0})
    values["client.local_epochs"] = 2
    values["secagg.enabled"] = secagg
    return load_config(None, values)


def default_cost_values(root: Path, secagg: bool = False) -> dict[str, Any]:
    """The job `fedveil simulate` runs on its defaults, in one process and one torch thread
    like its audit (which runs users in-process), without plots (an audit draws none)."""
    return {
        "simulation.workers": 1,
        "simulation.plots": False,
        "device": "cpu",
        "secagg.enabled": secagg,
        "out": str(root / "default-plain"),
    }


SUMMARY = __doc__.split("\n\n")[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `python -m fedveil.benchmarks.bench_audit`."""
    p.add_argument("--seeds", type=int, default=20, help="correct-mechanism audits (>= 20)")
    p.add_argument("--canaries", type=int, default=1000, help="canaries per audit")
    p.add_argument("--repeat", type=int, default=3, help="timed pairs per cost ratio")
    p.add_argument(
        "--cost-only", action="store_true", help="only the audit's cost, in the clear and secagg"
    )
    p.add_argument("--no-secagg-cost", action="store_true", help="skip the cost under secagg")
    p.add_argument(
        "--cost-config",
        choices=COST_CONFIGS,
        default="small",
        help="default: also cost the audit of the default job (minutes a pair; "
        "audit_cost_ratio is then its)",
    )
    p.add_argument("--no-distributed", action="store_true", help="skip the distributed-DP audits")
    p.add_argument("--json", action="store_true", help="print the JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    if args.cost_only:
        with tempfile.TemporaryDirectory(prefix="fedveil-audit-cost-") as tmp:
            result = costs(
                Path(tmp),
                args.canaries,
                secagg=not args.no_secagg_cost,
                repeat=args.repeat,
                config=args.cost_config,
            )
        for name in ("", "_secagg", "_default"):
            print(f"audit_cost{name}: {result[f'audit_cost{name}']}")
        print(
            f"audit_cost_ratio ({result['audit_cost_ratio_config']} config): "
            f"{result['audit_cost_ratio']:.4g}"
        )
        if args.json:
            print(json.dumps(result))
        return 0
    result = run_benchmark(
        seeds=args.seeds,
        canaries=args.canaries,
        secagg_cost=not args.no_secagg_cost,
        cost_repeat=args.repeat,
        distributed=not args.no_distributed,
        cost_config=args.cost_config,
    )
    for key in (
        "broken_claimed_epsilon",
        "broken_lower_bound",
        "broken_lower_bound_no_noise",
        "distributed_claimed_epsilon",
        "distributed_broken_lower_bound",
        "distributed_correct_lower_bound",
        "correct_max_lower_over_accounted",
        "correct_exceedances",
        "audit_cost_ratio",
        "audit_cost_ratio_secagg",
    ):
        print(
            f"{key}: {result[key]:.4g}"
            if isinstance(result[key], float)
            else f"{key}: {result[key]}"
        )
    print(f"(audit_cost_ratio is the {result['audit_cost_ratio_config']} config's)")
    if args.json:
        print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_audit",
        description=SUMMARY,
        add_arguments=add_arguments,
        run=run,
    )


if __name__ == "__main__":
    sys.exit(main())
