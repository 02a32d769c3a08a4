"""The canary audit's power and soundness (issue 20, part 1): a deliberately broken
mechanism must be refuted; the correct one must not be, beyond what chance allows.

    .venv/bin/python -m benchmarks.bench_audit --json [--seeds 20] [--canaries 1000]

Config: digits, MLP, 20 users, Poisson q = 1, one round, central DP with z = 2.3 (an
accounted epsilon below 2 at delta = 1e-5; q = 1 so the claim needs no amplification).
The broken runs keep the ledger's claim (z = 2.3) while the releases carry the noise
scaled by 1/4, and none (`AuditMechanism`, the harness's declared seam).

The last line of stdout is one JSON object:
  broken_claimed_epsilon                 the ledger's epsilon in the broken runs
  broken_lower_bound                     the 95% lower bound with the noise cut 4x
  broken_lower_bound_no_noise            ... with the noise off
  broken_estimate, broken_estimate_no_noise
  correct_max_lower_over_accounted       largest lower bound / accounted epsilon over seeds
  correct_exceedances                    seeds whose lower bound exceeded the claim (chance
                                         allows about 1 in 20 at 95%)
  correct_estimates                      each correct seed's estimate and interval
  audit_cost_ratio                       an audit in the clear (no DP) over the same run's
                                         plain wall time
  audit_cost_ratio_secagg                ... both under secure aggregation
  config, canaries, seeds, wall_s
No peer framework (Flower, NVFlare, TFF, FedML) ships an audit of epsilon: the comparison
is with the accountant's claim itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedveil.config import load_config
from fedveil.simulations.audit import AuditMechanism, run_audit
from fedveil.simulations.run import simulate


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
    *, seeds: int = 20, canaries: int = 1000, secagg_cost: bool = True
) -> dict[str, Any]:
    """`secagg_cost=False` skips the (slow) cost under secure aggregation: its key is None."""
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
        result["audit_cost_ratio"] = cost_ratio(root, canaries)
        result["audit_cost_ratio_secagg"] = (
            cost_ratio(root, canaries, secagg=True) if secagg_cost else None
        )
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def cost_ratio(root: Path, canaries: int, *, secagg: bool = False) -> float:
    """An audit in the clear (the config without DP) over the plain run's wall time, each
    timed after one untimed run of each (imports, caches). `secagg`: both under secure
    aggregation, where every sampled canary takes part in the protocol."""
    values = audit_config(0, root / "plain")
    values = {k: v for k, v in values.items() if not k.startswith("dp.")}
    # A run of ordinary length (local epochs, several rounds): canaries need no training,
    # so their cost is per round and per canary, not per local step.
    values.update({"simulation.plots": False, "server.rounds": 5, "client.local_steps": 0})
    values["client.local_epochs"] = 2
    values["secagg.enabled"] = secagg
    cfg = load_config(None, values)
    simulate(cfg)
    run_audit(cfg, canaries=canaries, out=root / "cost-warm")
    t0 = time.perf_counter()
    simulate(cfg)
    plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_audit(cfg, canaries=canaries, out=root / "cost")
    return (time.perf_counter() - t0) / plain


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="correct-mechanism audits (>= 20)")
    p.add_argument("--canaries", type=int, default=1000, help="canaries per audit")
    p.add_argument("--json", action="store_true", help="print the JSON summary as the last line")
    args = p.parse_args(argv)
    result = run_benchmark(seeds=args.seeds, canaries=args.canaries)
    for key in (
        "broken_claimed_epsilon",
        "broken_lower_bound",
        "broken_lower_bound_no_noise",
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
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
