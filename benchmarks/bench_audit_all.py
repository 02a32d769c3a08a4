"""`fedveil bench audit`: the three privacy-audit benchmarks of issue 20 in one process,
their figures merged into one JSON object.

    .venv/bin/python -m fedveil.benchmarks.bench_audit_all --json [--quick]

- update inversion (fedveil.benchmarks.bench_audit_attacks): inversion_psnr_plain,
  inversion_psnr_secagg, inversion_psnr_secagg_curve, inversion_psnr_dp,
  inversion_psnr_random_baseline, ...
- membership inference (fedveil.benchmarks.bench_audit_membership): mia_auc_nondp, mia_auc_dp, ...
- the canary audit (fedveil.benchmarks.bench_audit): broken_claimed_epsilon, broken_lower_bound,
  correct_max_lower_over_accounted, audit_cost_ratio, ...

Each benchmark keeps its own keys; `config` and `wall_s`, which two share, go under
`sizes` per benchmark. `--quick` runs each at a tiny size (a smoke test: its figures are
not the benchmarks' findings).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from fedveil.benchmarks import bench_audit, bench_audit_attacks, bench_audit_membership
from fedveil.benchmarks.harness import command_main, print_report

# The keys issue 20 asks for; the merged JSON has at least these.
REQUIRED_KEYS = (
    "inversion_psnr_plain",
    "inversion_psnr_secagg",
    "inversion_psnr_secagg_curve",
    "inversion_psnr_dp",
    "inversion_psnr_random_baseline",
    "mia_auc_nondp",
    "mia_auc_dp",
    "broken_claimed_epsilon",
    "broken_lower_bound",
    "correct_max_lower_over_accounted",
    "audit_cost_ratio",
)
_SHARED = ("config", "wall_s", "seeds")
# Tiny sizes for --quick: seconds each on two cores.
QUICK_ATTACKS = [
    "--seeds=1",
    "--images=1",
    "--iterations=20",
    "--unmix-steps=20",
    "--ks=2,20",
    "--batches=1",
    "--local-steps=1",
]
QUICK_MEMBERSHIP = {"seeds": 1, "shadows": 0, "members": 5, "rounds": 1, "epochs": 2}
QUICK_AUDIT = {"seeds": 1, "canaries": 20, "secagg_cost": False, "cost_repeat": 1}


AUDIT_SUMMARY = (
    "`fedveil bench audit`: the three privacy-audit benchmarks (update inversion against "
    "one client's update, the secure sum and its DP release; membership inference on a "
    "non-private and a DP run of an overfit config; the canary audit's power and "
    "soundness and its cost) in one process; --json prints one JSON object with every "
    "benchmark's keys as the last line of stdout."
)


def add_audit_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `fedveil bench audit`."""
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


def run_attacks(argv: list[str]) -> dict[str, Any]:
    """bench_audit_attacks prints its JSON as the last line of stdout: run it in this
    process and read that line back (its progress goes to stderr, as before)."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = bench_audit_attacks.main(argv)
    if code:
        raise RuntimeError(f"bench_audit_attacks {argv} exited {code}")
    return json.loads(captured.getvalue().strip().splitlines()[-1])


def run_all(
    *,
    quick: bool = False,
    attacks_argv: list[str] | None = None,
    membership: dict[str, Any] | None = None,
    audit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the three benchmarks in turn; one dict with every benchmark's keys."""
    start = time.perf_counter()
    parts = {
        "attacks": lambda: run_attacks([*(QUICK_ATTACKS if quick else []), *(attacks_argv or [])]),
        "membership": lambda: bench_audit_membership.run_benchmark(
            **{**(QUICK_MEMBERSHIP if quick else {}), **(membership or {})}
        ),
        "audit": lambda: bench_audit.run_benchmark(
            **{**(QUICK_AUDIT if quick else {}), **(audit or {})}
        ),
    }
    merged: dict[str, Any] = {"quick": quick, "sizes": {}}
    for name, run in parts.items():
        print(f"== {name} ==", file=sys.stderr, flush=True)
        got = run()
        merged["sizes"][name] = {k: got.pop(k) for k in _SHARED if k in got}
        merged.update(got)
    missing = [k for k in REQUIRED_KEYS if k not in merged]
    if missing:
        raise RuntimeError(f"the merged audit benchmark lacks {missing}")
    merged["wall_s"] = round(time.perf_counter() - start, 1)
    return merged


def from_args(args: argparse.Namespace) -> dict[str, Any]:
    attacks_argv = []
    for flag, value in (
        ("--seeds", args.seeds),
        ("--images", args.images),
        ("--curve-seeds", args.curve_seeds),
    ):
        if value is not None:
            attacks_argv.append(f"{flag}={value}")
    membership = {
        k: v for k, v in (("seeds", args.seeds), ("shadows", args.shadows)) if v is not None
    }
    audit = {
        k: v for k, v in (("seeds", args.audit_seeds), ("canaries", args.canaries)) if v is not None
    }
    return run_all(quick=args.quick, attacks_argv=attacks_argv, membership=membership, audit=audit)


def cmd_bench_audit(args: argparse.Namespace) -> int:
    result = from_args(args)
    print_report(result, format_report(result), args.json, sort_keys=False)
    return 0


def format_report(result: dict[str, Any]) -> str:
    """One line per required key."""
    lines = []
    for key in REQUIRED_KEYS:
        value = result[key]
        if key == "inversion_psnr_secagg_curve":
            value = ", ".join(f"K={p['k']} b={p['batch']}: {p['psnr']:.1f} dB" for p in value)
        elif isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """`fedveil bench ...` and `python -m fedveil.benchmarks.bench_audit_all`."""
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_audit_all",
        description=AUDIT_SUMMARY,
        add_arguments=add_audit_arguments,
        run=cmd_bench_audit,
    )


if __name__ == "__main__":
    sys.exit(main())
