"""`fedveil bench audit --json --quick`: the three privacy-audit benchmarks run as the user
runs them and print one JSON object with every key issue 20 asks for. No figure is
asserted: the figures at --quick sizes are a smoke test, the findings come from full runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from fedveil.benchmarks.bench_audit_all import REQUIRED_KEYS

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast


@pytest.mark.slow
def test_bench_audit_quick_prints_every_issue_key() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fedveil.cli", "bench", "audit", "--json", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in REQUIRED_KEYS:
        assert key in result, key
    assert result["quick"] is True
    curve = result["inversion_psnr_secagg_curve"]
    assert {(p["k"], p["batch"], p["local_steps"]) for p in curve} == {(2, 1, 1), (20, 1, 1)}
    assert result["inversion_psnr_secagg"] == next(p["psnr"] for p in curve if p["k"] == 20)
    for key in REQUIRED_KEYS:
        if key != "inversion_psnr_secagg_curve":
            assert math.isfinite(result[key]), key
    assert 0.0 <= result["mia_auc_nondp"] <= 1.0 and 0.0 <= result["mia_auc_dp"] <= 1.0
    # Each benchmark's own sizes are kept apart, not overwritten by the next one's.
    assert set(result["sizes"]) == {"attacks", "membership", "audit"}
    assert result["sizes"]["audit"]["config"]["dp.noise_multiplier"] == 2.3
