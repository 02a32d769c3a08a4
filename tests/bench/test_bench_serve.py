"""`fedveil bench serve --json --quick`: the serving benchmark run as the user runs it prints
every key issue 23 asks for. No figure is asserted: --quick phases last half a second, so
its figures are a smoke test, not the benchmark's findings."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

REQUIRED = (
    "throughput_ratio",
    "throughput_ratio_256",
    "json_throughput_ratio",
    "p99_s_at_half_saturation",
)


@pytest.mark.slow
def test_bench_serve_quick_prints_every_issue_key() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fedveil.cli", "bench", "serve", "--json", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in REQUIRED:
        assert math.isfinite(result[key]) and result[key] > 0, key
    assert result["quick"] is True
    # Merged batch sizes come from the server's /metrics, per phase; every request answered.
    for kind in ("npz_32", "npz_256", "json_32"):
        served = result["served"][kind]
        assert served["errors"] == 0 and served["forward_passes"] > 0
        assert result["merged_batch_rows_mean"][kind] >= (256 if kind == "npz_256" else 32)
        assert 0 < result["loadgen_cpu_share"][kind] < 2
    rates = [p["offered_rps"] for p in result["latency_curve"]]
    assert rates == sorted(rates) and all(p["errors"] == 0 for p in result["latency_curve"])
    assert "load_before" in result["machine"]
    assert set(result["cpu_efficiency_ratio"]) == {"npz_32", "npz_256", "json_32"}
    assert "target throughput_ratio >= 0.8" in done.stderr  # the human report, on stderr
