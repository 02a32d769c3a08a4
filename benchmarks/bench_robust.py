"""`fedveil bench robust`: poisoning attacks x aggregators (issue 22).

Every cell is one in-process simulation (`[poisoning]` attackers, `server.aggregator`
rule) on a Dirichlet(alpha) split; it reports the final test accuracy, the backdoor
accuracy (triggered test inputs whose true class is not the target, scored as the target)
and in how many rounds the rule's attacker bound did not hold on the cohort that arrived
(`robust_bound_failed_rounds`, with the rule's bound: it compares f with the updates that
arrived, so it fails only after dropouts), and in how many rounds more than f attackers are
expected in the cohort (`rounds_attackers_over_f_expected`, hypergeometric: the server
cannot see who attacks). Rows with attack 'none' are each
aggregator's clean run, and `clean_accuracy` is FedAvg's (aggregator 'mean', no attack).
A rule's f (`server.attackers_tolerated`) covers the attackers of 95% of cohorts at the
row's fraction (`--f-rule tail`; `mean`: those of an average cohort); the clean run uses
the smallest attacked fraction's f, so it is the same rule the attacked runs are compared
with.

The backdoor curve runs model replacement (attack 'scaled') over attacker fractions for
the plain mean, norm bounding, and norm bounding with weak DP (Sun et al. 2019).
`secagg_mean` rows run the plain mean under secure aggregation: there the attacker goes
through the client's own clip (per coordinate to [-r, r]); one that skips it is what
`secagg.sum_check` is for (tests/engine/test_sum_checks.py).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedveil.benchmarks.harness import command_main, float_list, name_list, print_report
from fedveil.config import load_config
from fedveil.config.robust_bounds import min_cohort
from fedveil.simulations.poisoning import choose_attackers
from fedveil.simulations.simulate_run import simulate

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

MEAN = "mean"
BOUNDS = {
    "mean": "none",
    SECAGG_MEAN: "none",
    "median": "f < n/2",
    "trimmed_mean": "2f < n",
    "krum": "n >= 2f + 3",
    "multi_krum": "n >= 2f + 3",
    "bulyan": "n >= 4f + 3",
    "norm_bound": "none (bounds each update)",
}


def add_robust_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench robust`."""
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
        type=name_list,
        default=["sign_flip", "gaussian", "scaled"],
        help="comma list of label_flip, sign_flip, gaussian, scaled, backdoor "
        "[sign_flip,gaussian,scaled]",
    )
    p.add_argument(
        "--aggregators",
        type=name_list,
        default=["mean", "median", "trimmed_mean", "multi_krum", "norm_bound", SECAGG_MEAN],
        help="comma list of mean, median, trimmed_mean, krum, multi_krum, bulyan, "
        f"norm_bound, {SECAGG_MEAN} [mean,median,trimmed_mean,multi_krum,norm_bound,"
        f"{SECAGG_MEAN}]",
    )
    p.add_argument("--fractions", type=float_list, default=[0.1, 0.2], help="[0.1,0.2]")
    p.add_argument(
        "--curve-fractions",
        type=float_list,
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


@dataclass(frozen=True)
class Grid:
    dataset: str
    model: str
    clients: int
    per_round: int
    rounds: int
    alpha: float
    seed: int
    scale: float
    std: float
    norm_bound: float
    weak_dp_noise: float
    f_rule: str = "tail"


def over_f_share(clients: int, attackers: int, per_round: int, f: int) -> float:
    """P(more than f attackers in a cohort of per_round drawn without replacement from
    clients, attackers of them malicious): the share of rounds where the rule's f does not
    cover the attackers present (hypergeometric; the server cannot see this per round)."""
    total = math.comb(clients, per_round)
    hi = min(attackers, per_round)
    over = sum(
        math.comb(attackers, k) * math.comb(clients - attackers, per_round - k)
        for k in range(f + 1, hi + 1)
    )
    return over / total


# --f-rule tail: f covers the attackers of all but this share of cohorts.
TAIL = 0.05


def tolerated(g: Grid, fraction: float) -> int:
    """A rule's f at this attacker fraction (at least 1): 'mean', the attackers an average
    cohort holds; 'tail', the fewest f with more than f attackers in at most 5% of
    cohorts (issue 22: size f for the tail, not the average)."""
    if g.f_rule == "mean":
        return max(1, math.ceil(fraction * g.per_round))
    count = len(choose_attackers(g.clients, fraction, g.seed))
    f = 1
    while f < g.per_round and over_f_share(g.clients, count, g.per_round, f) > TAIL:
        f += 1
    return f


def run_cell(
    g: Grid, attack: str, fraction: float, aggregator: str, f: int, out: Path, noise: float = 0.0
) -> dict[str, Any]:
    values: dict[str, Any] = {
        "data.dataset": g.dataset,
        "data.num_clients": g.clients,
        "data.partition": "dirichlet",
        "data.alpha": g.alpha,
        "model.name": g.model,
        "server.per_round": g.per_round,
        "server.rounds": g.rounds,
        "seed": g.seed,
        "eval.central_every": g.rounds,  # the final model only (backdoor accuracy with it)
        "out": str(out),
        # Every run carries an attack so backdoor accuracy is measured; 'none' is fraction 0.
        "poisoning.attack": "scaled" if attack == "none" else attack,
        "poisoning.fraction": 0.0 if attack == "none" else fraction,
        "poisoning.scale": g.scale,
        "poisoning.std": g.std,
    }
    if aggregator == SECAGG_MEAN:
        values["secagg.enabled"] = True
    elif aggregator != MEAN:
        values["server.aggregator"] = aggregator
        if aggregator == "norm_bound":
            values["server.norm_bound"] = g.norm_bound
            if noise > 0:
                values["server.weak_dp_noise"] = noise
        else:
            values["server.attackers_tolerated"] = f
    clipped = [0]

    def on_round(record: Any) -> None:
        clipped[0] += int(record.extra.get("robust_clipped", 0))

    start = time.perf_counter()
    summary = simulate(load_config(None, values), on_round=on_round)
    row = {
        "attack": attack,
        "fraction": 0.0 if attack == "none" else fraction,
        "aggregator": aggregator + ("+weak_dp" if noise > 0 else ""),
        "accuracy": summary.get("test_accuracy"),
        "backdoor_accuracy": summary.get("backdoor_accuracy"),
        "attackers_tolerated": f if aggregator not in (MEAN, SECAGG_MEAN, "norm_bound") else None,
        "bound": BOUNDS.get(aggregator, "?"),
        "robust_bound_failed_rounds": summary.get("robust_bound_failed_rounds", 0),
        "rounds": g.rounds,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    if aggregator == "norm_bound":
        row["updates_clipped"] = clipped[0]
    if row["attackers_tolerated"] is not None and attack != "none":
        count = len(choose_attackers(g.clients, fraction, g.seed))
        share = over_f_share(g.clients, count, g.per_round, f)
        row["rounds_attackers_over_f_expected"] = round(share * g.rounds, 2)
    return row


def bench(
    g: Grid,
    attacks: list[str],
    aggregators: list[str],
    fractions: list[float],
    curve_fractions: list[float],
    log: Any = sys.stderr,
) -> dict[str, Any]:
    for agg in aggregators:
        if agg in ("mean", SECAGG_MEAN, "norm_bound"):
            continue
        f = tolerated(g, max(fractions))
        need = min_cohort(agg, f)
        if g.per_round < need:
            raise ValueError(
                f"--per-round {g.per_round}: {agg} at fraction {max(fractions)} (f = {f}) "
                f"needs a cohort of at least {need}"
            )
    done: dict[tuple[str, float, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-robust-") as tmp:
        counter = [0]

        def cell(attack: str, fraction: float, agg: str, noise: float = 0.0) -> dict[str, Any]:
            label = agg + ("+weak_dp" if noise > 0 else "")
            key = (attack, 0.0 if attack == "none" else fraction, label)
            if key not in done:
                counter[0] += 1
                f = tolerated(g, fraction if attack != "none" else min(fractions))
                row = run_cell(g, attack, fraction, agg, f, Path(tmp) / f"r{counter[0]}", noise)
                print(
                    f"  {label:>20} {attack:>10} f={key[1]:<5g} acc={row['accuracy']:.4f} "
                    f"backdoor={row['backdoor_accuracy']:.4f} "
                    f"bound_failed={row['robust_bound_failed_rounds']} ({row['wall_s']} s)",
                    file=log,
                    flush=True,
                )
                done[key] = row
            return done[key]

        table = []
        for agg in aggregators:
            table.append(cell("none", 0.0, agg))
            for attack in attacks:
                for fraction in fractions:
                    table.append(cell(attack, fraction, agg))
        curve = []
        for fraction in curve_fractions:
            for agg, noise in ((MEAN, 0.0), ("norm_bound", 0.0), ("norm_bound", g.weak_dp_noise)):
                if agg == "norm_bound" and noise > 0 and g.weak_dp_noise <= 0:
                    continue
                row = cell("scaled", fraction, agg, noise)
                curve.append(
                    {
                        "fraction": fraction,
                        "aggregator": row["aggregator"],
                        "accuracy": row["accuracy"],
                        "backdoor_accuracy": row["backdoor_accuracy"],
                    }
                )
    clean = done.get(("none", 0.0, MEAN))
    return {
        "grid": vars(g),
        "table": table,
        "clean_accuracy": None if clean is None else clean["accuracy"],
        "backdoor_curve": curve,
        "targets": targets(table),
    }


def _find(table: list[dict[str, Any]], attack: str, fraction: float, agg: str) -> Any:
    for row in table:
        if (row["attack"], row["fraction"], row["aggregator"]) == (attack, fraction, agg):
            return row
    return None


def targets(table: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, each True/False where its rows ran, else absent."""
    out: dict[str, Any] = {}
    for attack in ("sign_flip", "gaussian"):
        row = _find(table, attack, 0.1, MEAN)
        if row is not None:
            out[f"mean_{attack}_10pct_below_50pct"] = row["accuracy"] < 0.5
    for agg in ("median", "trimmed_mean", "multi_krum"):
        row, clean = _find(table, "sign_flip", 0.1, agg), _find(table, "none", 0.0, agg)
        if row is not None and clean is not None:
            out[f"{agg}_sign_flip_10pct_within_3_points"] = (
                clean["accuracy"] - row["accuracy"] <= 0.03
            )
    mean, nb = _find(table, "scaled", 0.1, MEAN), _find(table, "scaled", 0.1, "norm_bound")
    if mean is not None and nb is not None:
        out["norm_bound_halves_mean_backdoor_10pct"] = (
            nb["backdoor_accuracy"] <= mean["backdoor_accuracy"] / 2
        )
    return out


def format_report(summary: dict[str, Any]) -> str:
    g = summary["grid"]
    lines = [
        f"fedveil bench robust: {g['dataset']} Dirichlet({g['alpha']:g}), {g['model']}, "
        f"{g['clients']} clients, {g['per_round']} per round, {g['rounds']} rounds",
        f"clean accuracy (FedAvg, no attack): {summary['clean_accuracy']}",
        f"{'aggregator':>16} {'attack':>10} {'frac':>5} {'acc':>7} {'clean':>7} "
        f"{'backdoor':>8} {'bound':>26} {'failed':>6} {'>f exp.':>7}",
    ]
    table = summary["table"]
    for row in table:
        clean = _find(table, "none", 0.0, row["aggregator"])
        lines.append(
            f"{row['aggregator']:>16} {row['attack']:>10} {row['fraction']:>5g} "
            f"{row['accuracy']:>7.4f} {clean['accuracy'] if clean else float('nan'):>7.4f} "
            f"{row['backdoor_accuracy']:>8.4f} {row['bound']:>26} "
            f"{row['robust_bound_failed_rounds']:>6} "
            f"{row.get('rounds_attackers_over_f_expected', ''):>7}"
        )
    if summary["backdoor_curve"]:
        lines.append("backdoor accuracy under model replacement (attack 'scaled'), by fraction:")
        for row in summary["backdoor_curve"]:
            lines.append(
                f"  {row['fraction']:>5g} {row['aggregator']:>18} acc={row['accuracy']:.4f} "
                f"backdoor={row['backdoor_accuracy']:.4f}"
            )
    for name, ok in summary["targets"].items():
        lines.append(f"target {name}: {'met' if ok else 'NOT met'}")
    return "\n".join(lines)


def cmd_bench_robust(args: argparse.Namespace) -> int:
    g = Grid(
        dataset=args.dataset,
        model=args.model,
        clients=args.clients,
        per_round=args.per_round,
        rounds=args.rounds,
        alpha=args.alpha,
        seed=args.seed,
        scale=args.scale,
        std=args.std,
        norm_bound=args.norm_bound or ROBUST_NORM_BOUNDS[args.dataset],
        weak_dp_noise=args.weak_dp_noise,
        f_rule=args.f_rule,
    )
    summary = bench(g, args.attacks, args.aggregators, args.fractions, args.curve_fractions)
    print_report(summary, format_report(summary), args.json)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_robust`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_robust",
        description=ROBUST_SUMMARY,
        add_arguments=add_robust_arguments,
        run=cmd_bench_robust,
    )


if __name__ == "__main__":
    sys.exit(main())
