"""`fedveil bench robust`: the attack x aggregator table, as a user runs it (a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--dataset", "digits", "--clients", "10", "--per-round", "5", "--rounds", "1",
    "--attacks", "sign_flip", "--aggregators", "mean,median", "--fractions", "0.1",
]  # fmt: skip


def bench(*flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fedveil.cli", "bench", "robust", *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.procs
def test_the_json_has_the_issue_table_and_the_backdoor_curve():
    done = bench(*SMALL, "--curve-fractions", "0.1", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {(r["attack"], r["fraction"], r["aggregator"]): r for r in summary["table"]}
    assert set(rows) == {
        ("none", 0.0, "mean"),
        ("sign_flip", 0.1, "mean"),
        ("none", 0.0, "median"),
        ("sign_flip", 0.1, "median"),
    }
    for row in summary["table"]:
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["backdoor_accuracy"] <= 1.0
        assert row["robust_bound_failed_rounds"] in range(2)
    assert summary["clean_accuracy"] == rows[("none", 0.0, "mean")]["accuracy"]
    assert rows[("sign_flip", 0.1, "median")]["bound"] == "f < n/2"
    # 1 attacker of 10, cohorts of 5, f = 1: never more than f in a round.
    assert rows[("sign_flip", 0.1, "median")]["rounds_attackers_over_f_expected"] == 0.0
    curve = {(c["fraction"], c["aggregator"]) for c in summary["backdoor_curve"]}
    assert curve == {(0.1, "mean"), (0.1, "norm_bound"), (0.1, "norm_bound+weak_dp")}
    assert "aggregator" in done.stderr  # the human table goes to stderr under --json


def test_a_cohort_too_small_for_the_rule_is_refused_by_name(fedveil_cli):
    done = fedveil_cli(
        "bench", "robust", *SMALL[:4], "--per-round", "8", "--aggregators", "bulyan",
        "--fractions", "0.2",
    )  # fmt: skip
    assert done.returncode != 0
    assert "--per-round 8: bulyan at fraction 0.2 (f = 2) needs a cohort of at least 11" in (
        done.stderr
    )
