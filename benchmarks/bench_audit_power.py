"""The privacy audit's power and soundness at the README's default settings (issue 28):
the f-DP audit must refute noise cut 4x and noise off, and pass the correct mechanism.

    .venv/bin/python -m fedveil.benchmarks.bench_audit_power --json
    .venv/bin/python -m fedveil.benchmarks.bench_audit_power --canaries 1000 --json
    .venv/bin/python -m fedveil.benchmarks.bench_audit_power --ceilings 1000,2000,5000 --json
    .venv/bin/python -m fedveil.benchmarks.bench_audit_power --real --seeds-broken 1 \
        --seeds-correct 1 --json

Settings: central DP at epsilon 8, delta 1e-5, Poisson q = 0.2, T = 60 rounds (z = 1.216,
the noise the PLD accountant calibrates for epsilon 8), `--canaries` Dirac canaries.
The mechanism is the idealised simulation (`fedveil.privacy.audit.canary_sums`): each
canary's statistic is what the harness computes (the sum over rounds of its
projection), with the users' updates left out; `--noise-scale` 1, 1/4 and 0 are the
correct mechanism and the broken ones (the ledger claims z throughout). Each seed draws
its own canaries, inclusion and noise; the audit is `fdp_audit` at 99%, exactly as
`fedveil privacy audit` runs it on the statistics of a real run.

Goal (issue 28): noise/4 refuted in >= 9 of 10 seeds, noise off in 10 of 10, the correct
mechanism passes in >= 19 of 20.

The last line of stdout is one JSON object:
  settings                      q, T, z, epsilon, delta, canaries, confidence
  refuted_quarter_noise         seeds refuted with the noise cut 4x, of seeds_broken
  refuted_no_noise              seeds refuted with the noise off, of seeds_broken
  passed_correct                seeds the correct mechanism passed, of seeds_correct
  p_values                      each seed's p-value, per mechanism
  correct_guesses               each seed's correct guesses (of `guesses`), per mechanism
  steinke_lower_bound_max       the largest Steinke-Nasr-Jagielski bound (delta term
                                included) over the broken seeds: the conservative line
  ceilings                      --ceilings: the ceiling epsilon per canary count
  real                          --real: real audited runs through the harness
                                (`run_audit`, the AuditMechanism seam) of a small job at
                                the same DP settings: digits MLP (9,610 parameters), 100
                                users, Poisson q = 0.2, 60 rounds, central DP at epsilon 8
                                (z calibrated by the config), one run per mechanism:
                                verdict, accounted epsilon, p-value, guesses, ceiling
  wall_s
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedveil.benchmarks.harness import command_main
from fedveil.privacy.audit import fdp_audit, one_run_lower_bound
from fedveil.privacy.audit.canary_sums import simulate_canary_sums
from fedveil.privacy.audit.fdp import CONFIDENCE, ceiling_epsilon, guesses_for
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol.dp_rules import PLD

# The README's defaults: epsilon 8 at delta 1e-5, q = 0.2, T = 60; z as calibrated.
RATE, ROUNDS, Z, EPSILON, DELTA = 0.2, 60, 1.216, 8.0, 1e-5
MECHANISMS = {"correct": 1.0, "quarter_noise": 0.25, "no_noise": 0.0}


def claim() -> list[PrivacyEvent]:
    return [PrivacyEvent(noise_multiplier=Z, sampling_rate=RATE, steps=ROUNDS)]


def run_power(
    *, canaries: int = 2000, seeds_broken: int = 10, seeds_correct: int = 20
) -> dict[str, Any]:
    """Each mechanism over its seeds (seed s of mechanism i: default_rng([i, s]))."""
    p_values: dict[str, list[float]] = {}
    correct: dict[str, list[int]] = {}
    steinke: list[float] = []
    for index, (name, scale) in enumerate(MECHANISMS.items()):
        seeds = seeds_correct if name == "correct" else seeds_broken
        for seed in range(seeds):
            rng = np.random.default_rng([index, seed])
            inserted, stats = simulate_canary_sums(rng, canaries, RATE, ROUNDS, Z, scale)
            audit = fdp_audit(stats, inserted, claim(), DELTA, PLD, bounds=False)
            p_values.setdefault(name, []).append(audit.p_value)
            correct.setdefault(name, []).append(audit.correct)
            if name != "correct":
                bound = one_run_lower_bound(stats, inserted, delta=DELTA)
                steinke.append(bound.epsilon)
            print(
                f"{name} seed {seed}: {audit.correct}/{audit.guesses} right, "
                f"p <= {audit.p_value:.3g}, {'REFUTED' if audit.refuted else 'passes'}",
                file=sys.stderr,
                flush=True,
            )
    beta = 1 - CONFIDENCE
    return {
        "refuted_quarter_noise": sum(p <= beta for p in p_values.get("quarter_noise", [])),
        "refuted_no_noise": sum(p <= beta for p in p_values.get("no_noise", [])),
        "passed_correct": sum(p > beta for p in p_values.get("correct", [])),
        "seeds_broken": seeds_broken,
        "seeds_correct": seeds_correct,
        "guesses": guesses_for(canaries),
        "p_values": p_values,
        "correct_guesses": correct,
        "steinke_lower_bound_max": max(steinke) if steinke else None,
    }


def real_config(out: str) -> dict[str, Any]:
    return {
        "data.dataset": "digits",
        "data.partition": "iid",
        "model.name": "mlp",
        "data.num_clients": 100,
        "server.sampling": "poisson",
        "server.sample_rate": RATE,
        "server.rounds": ROUNDS,
        "client.local_steps": 1,
        "eval.central_every": 0,
        "device": "cpu",
        "simulation.workers": 1,
        "simulation.plots": False,
        "dp.mechanism": "central",
        "dp.epsilon": EPSILON,
        "dp.delta": DELTA,
        "out": out,
    }


def run_real(canaries: int) -> dict[str, Any]:
    """One real audit per mechanism (correct, noise cut 4x) through `run_audit`."""
    import tempfile
    from pathlib import Path

    from fedveil.config import load_config
    from fedveil.simulations.audit import AuditMechanism, run_audit

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fedveil-audit-power-") as tmp:
        cfg = load_config(None, real_config(str(Path(tmp) / "run")))
        for name, scale in (("quarter_noise", 0.25), ("correct", 1.0)):
            got = run_audit(
                cfg, canaries=canaries, out=Path(tmp) / name, mechanism=AuditMechanism(scale)
            )
            fdp = got["fdp"]
            found[name] = {
                "refuted": got["refuted"],
                "accounted_epsilon": got["accounted_epsilon"],
                "p_value": fdp["p_value"],
                "correct": fdp["correct"],
                "guesses": fdp["guesses"],
                "lower_bound_epsilon": got["lower_bound_epsilon"],
                "ceiling_epsilon": got["ceiling_epsilon"],
                "steinke_epsilon": got["steinke"]["epsilon"],
                "wall_s": got["wall_s"],
                "verdict": got["verdict"],
            }
            print(f"real {name}: {got['verdict']}", file=sys.stderr, flush=True)
    return found


SUMMARY = __doc__.split("\n\n")[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `python -m fedveil.benchmarks.bench_audit_power`."""
    p.add_argument("--canaries", type=int, default=2000, help="canaries per audit")
    p.add_argument("--seeds-broken", type=int, default=10, help="seeds per broken mechanism")
    p.add_argument("--seeds-correct", type=int, default=20, help="seeds, correct mechanism")
    p.add_argument(
        "--ceilings",
        default="",
        metavar="M1,M2,...",
        help="also the ceiling epsilon at these canary counts (e.g. 1000,2000,5000)",
    )
    p.add_argument(
        "--real", action="store_true", help="also real audited runs of a small job (minutes)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON summary as the last line")


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    result: dict[str, Any] = {
        "settings": {
            "sampling_rate": RATE,
            "rounds": ROUNDS,
            "noise_multiplier": Z,
            "epsilon": EPSILON,
            "delta": DELTA,
            "canaries": args.canaries,
            "confidence": CONFIDENCE,
        }
    }
    result.update(
        run_power(
            canaries=args.canaries,
            seeds_broken=args.seeds_broken,
            seeds_correct=args.seeds_correct,
        )
    )
    counts = [int(c) for c in args.ceilings.split(",") if c.strip()]
    result["ceilings"] = {
        str(m): ceiling_epsilon(claim(), DELTA, PLD, m, CONFIDENCE) for m in counts
    }
    result["real"] = run_real(args.canaries) if args.real else None
    result["wall_s"] = round(time.perf_counter() - start, 1)
    print(f"noise/4 refuted: {result['refuted_quarter_noise']} of {args.seeds_broken}")
    print(f"noise off refuted: {result['refuted_no_noise']} of {args.seeds_broken}")
    print(f"correct mechanism passed: {result['passed_correct']} of {args.seeds_correct}")
    print(f"Steinke-Nasr-Jagielski bound, broken runs, max: {result['steinke_lower_bound_max']}")
    for m, eps in result["ceilings"].items():
        print(f"ceiling at {m} canaries: no epsilon above {eps:.3g} can be refuted")
    for name, got in (result["real"] or {}).items():
        print(f"real run, {name}: {got['verdict']}")
    if args.json:
        print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    return command_main(
        argv,
        prog=prog or "python -m fedveil.benchmarks.bench_audit_power",
        description=SUMMARY,
        add_arguments=add_arguments,
        run=run,
    )


if __name__ == "__main__":
    sys.exit(main())
