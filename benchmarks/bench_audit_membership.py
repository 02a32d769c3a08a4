"""Membership inference on the final global model: a non-private run and a DP run of the
same deliberately overfit config (digits, MLP, few examples per client, many local epochs),
loss and offline-LiRA attacks at client level, over several seeds (medians reported).

    .venv/bin/python -m fedveil.benchmarks.bench_audit_membership --json [--seeds 3] [--shadows 4]

The last line of stdout is one JSON object:
  mia_auc_nondp, mia_auc_dp                    median AUC of the stronger attack
  mia_tpr_at_1pct_fpr_nondp, mia_tpr_at_1pct_fpr_dp
  mia_auc_{nondp,dp}_{loss,lira}, mia_tpr_at_1pct_fpr_{nondp,dp}_{loss,lira}
  mia_bound_violations_dp                      ROC points above TPR <= e^eps*FPR + delta,
  mia_bound_significant_violations_dp          summed over attacks and seeds (raw; and those
                                               whose 95% Clopper-Pearson intervals cross it)
  mia_dp_epsilon, mia_dp_delta, per_seed, config, wall_s
No peer framework ships a membership attack on its runs (Flower, NVFlare, TFF): the
comparison here is the DP claim itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedveil.benchmarks.harness import command_main
from fedveil.config import load_config
from fedveil.simulations.attacks.membership import attack_membership

ATTACKS = ("loss", "lira")


def overfit_config(members: int, rounds: int, epochs: int, epsilon: float, seed: int) -> dict:
    return {
        "seed": seed,
        "data.dataset": "digits",
        "data.partition": "iid",
        "model.name": "mlp",
        "data.num_clients": members,
        "server.per_round": members,
        "server.rounds": rounds,
        "client.local_epochs": epochs,
        "client.lr": 0.1,
        "eval.central_every": 0,
        "device": "cpu",
        "dp.mechanism": "central",
        "dp.epsilon": epsilon,
    }


def run_benchmark(
    *,
    seeds: int = 3,
    shadows: int = 4,
    members: int = 25,
    rounds: int = 5,
    epochs: int = 20,
    epsilon: float = 2.0,
    out: Path | None = None,
) -> dict[str, Any]:
    start = time.perf_counter()
    per_seed = []
    with tempfile.TemporaryDirectory(prefix="fedveil-mia-") as tmp:
        root = Path(out or tmp)
        for seed in range(seeds):
            cfg = load_config(None, overfit_config(members, rounds, epochs, epsilon, seed))
            got = attack_membership(cfg, root / f"seed-{seed}", shadows=shadows)
            per_seed.append(got["runs"])
            print(f"seed {seed}: {_line(got['runs'])}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {}
    for run in ("nondp", "dp"):
        for attack in ATTACKS if shadows else ("loss",):
            aucs = [s[run]["attacks"][attack]["auc"] for s in per_seed]
            tprs = [s[run]["attacks"][attack]["tpr_at_1pct_fpr"] for s in per_seed]
            result[f"mia_auc_{run}_{attack}"] = statistics.median(aucs)
            result[f"mia_tpr_at_1pct_fpr_{run}_{attack}"] = statistics.median(tprs)
        best = max(
            (a for a in ATTACKS if f"mia_auc_{run}_{a}" in result),
            key=lambda a: result[f"mia_auc_{run}_{a}"],
        )
        result[f"mia_auc_{run}"] = result[f"mia_auc_{run}_{best}"]
        result[f"mia_tpr_at_1pct_fpr_{run}"] = result[f"mia_tpr_at_1pct_fpr_{run}_{best}"]
        result[f"mia_best_attack_{run}"] = best
    bounds = [a["bound"] for s in per_seed for a in s["dp"]["attacks"].values()]
    result["mia_bound_violations_dp"] = sum(b["violations"] for b in bounds)
    result["mia_bound_significant_violations_dp"] = sum(b["significant_violations"] for b in bounds)
    result["mia_bound_points_checked"] = "every ROC point of every attack and seed"
    result["mia_dp_epsilon"] = statistics.median(s["dp"]["epsilon"] for s in per_seed)
    result["mia_dp_delta"] = per_seed[0]["dp"]["delta"]
    result["per_seed"] = per_seed
    result["config"] = {
        "members": members,
        "non_members": members,
        "rounds": rounds,
        "local_epochs": epochs,
        "shadows": shadows,
        "seeds": seeds,
        "dataset": "digits (IID, 4 * members clients: members, held out, shadow pool)",
    }
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def _line(runs: dict[str, Any]) -> str:
    return "; ".join(
        f"{name} " + ", ".join(f"{a} AUC {r['auc']:.3f}" for a, r in run["attacks"].items())
        for name, run in runs.items()
    )


SUMMARY = __doc__.split("\n\n")[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `python -m fedveil.benchmarks.bench_audit_membership`."""
    p.add_argument("--seeds", type=int, default=3, help="seeds; medians reported [3]")
    p.add_argument("--shadows", type=int, default=4, help="shadow models per run [4]")
    p.add_argument("--members", type=int, default=25, help="member clients [25]")
    p.add_argument("--rounds", type=int, default=5, help="rounds [5]")
    p.add_argument("--epochs", type=int, default=20, help="local epochs [20]")
    p.add_argument("--epsilon", type=float, default=2.0, help="the DP run's budget [2]")
    p.add_argument("--out", type=Path, help="keep the runs here (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    result = run_benchmark(
        seeds=args.seeds,
        shadows=args.shadows,
        members=args.members,
        rounds=args.rounds,
        epochs=args.epochs,
        epsilon=args.epsilon,
        out=args.out,
    )
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            if key != "per_seed":
                print(f"{key}: {value}")
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_audit_membership",
        description=SUMMARY,
        add_arguments=add_arguments,
        run=run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
