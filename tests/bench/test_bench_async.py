"""`fedveil bench async --quick`: the five contenders as a user runs them (real processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTENDERS = {"sync", "sync_deadline", "async", "async_secagg", "async_secagg_whole"}
KEYS = {
    "time_to_target_ratio",
    "time_to_target_ratio_deadline",
    "cpu_per_update_ratio",
    "secagg_overhead_ratio",
    "secagg_whole_overhead_ratio",
    "target_accuracy",
}


def bench(*flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fedveil.cli", "bench", "async", *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.procs
@pytest.mark.timeout(900)  # above the command's own 600 s limit
def test_quick_bench_reports_the_issue_keys_with_sane_numbers(tmp_path):
    done = bench("--quick", "--json", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary) >= KEYS
    assert summary["target_accuracy"] == 0.5
    (seed,) = summary["per_seed"]
    assert set(seed) >= CONTENDERS
    for name in CONTENDERS:
        row = seed[name]
        # Every contender reached the low target, after some simulated time and real CPU.
        assert row["time_to_target_s"] > 0 and row["final_accuracy"] >= 0.5, (name, row)
        assert row["client_updates"] > 0 and 0 < row["cpu_per_update_s"] < 60, (name, row)
    for key in KEYS - {"target_accuracy"}:
        assert 0.05 < summary[key] < 20, (key, summary[key])
    # Sync rounds have no staleness; async updates do, and it shows in the run's plots.
    assert seed["sync"]["mean_staleness"] is None and seed["async"]["mean_staleness"] > 0
    async_dir = tmp_path / "seed0" / "async"
    assert {"staleness.png", "in_flight.png"} <= {p.name for p in async_dir.glob("*.png")}
    assert (tmp_path / "accuracy_over_time.png").stat().st_size > 10_000
    # Same clients in flight: the sync cohort is the async concurrency; the deadline is a
    # latency within the log-normal's range, and secagg runs in groups.
    cfg = summary["configs"]
    assert cfg["sync"]["server.per_round"] == cfg["async"]["server.concurrency"] == 6
    assert cfg["sync_deadline"]["server.round_timeout"] > cfg["sync"]["simulation.latency_median"]
    # async_secagg: groups of G = K + ceil(0.3 K) = 4 released at R = K = 3, the threat
    # model's dropouts covering the one member left out; whole groups: G = K, no release.
    secure, whole = cfg["async_secagg"], cfg["async_secagg_whole"]
    assert secure["secagg.enabled"] and secure["server.group_size"] == 4
    assert secure["server.group_release_at"] == 3 and secure["secagg.dropout_rate"] == 0.25
    assert whole["server.group_size"] == 3 and "server.group_release_at" not in whole
    # Dispatched once S = R = 3 slots are free, the fourth member as a slot frees; whole
    # groups at once.
    assert secure["server.group_dispatch_at"] == 3 and "server.group_dispatch_at" not in whole
    assert summary["peer"]["time_to_target_ratio"] == 3.0
    assert "time_to_target_ratio" in done.stderr  # the human table goes to stderr under --json


def test_a_secagg_group_too_small_for_the_protocol_is_refused_by_name(tmp_path, fedveil_cli):
    done = fedveil_cli(
        "bench", "async", "--quick", "--buffer", "2", "--group-size", "2", "--out", str(tmp_path)
    )
    assert done.returncode != 0
    assert "--group-size = 2: must be in [max(3, --buffer = 2), --concurrency = 6]" in done.stderr
    assert not (tmp_path / "seed0").exists()  # refused before any contender ran


def test_the_late_member_flags_reach_the_rolling_secure_contender_only(tmp_path):
    """--member-model and --start-order (server.group_member_model, group_start_order)
    configure async_secagg's rolling groups; the defaults leave every config as before."""
    import argparse

    from fedveil.benchmarks import bench_async

    parser = argparse.ArgumentParser()
    bench_async.add_async_arguments(parser)
    plain = bench_async.resolve(parser.parse_args(["--quick"]))
    late = bench_async.resolve(
        parser.parse_args(["--quick", "--member-model", "start", "--start-order", "random"])
    )
    for name in ("async_secagg", "async_secagg_whole", "async"):
        before = bench_async.contender_values(name, plain, 0, tmp_path)
        assert "server.group_member_model" not in before
        assert "server.group_start_order" not in before
    secure = bench_async.contender_values("async_secagg", late, 0, tmp_path)
    assert secure["server.group_member_model"] == "start"
    assert secure["server.group_start_order"] == "random"
    whole = bench_async.contender_values("async_secagg_whole", late, 0, tmp_path)
    assert "server.group_member_model" not in whole and "server.group_start_order" not in whole


def test_the_unmask_flag_reaches_the_secure_contender_only(tmp_path):
    """--unmask threshold (server.group_unmask) ends async_secagg's unmask stages at t
    replies; the default leaves every config as before."""
    import argparse

    from fedveil.benchmarks import bench_async

    parser = argparse.ArgumentParser()
    bench_async.add_async_arguments(parser)
    plain = bench_async.resolve(parser.parse_args(["--quick"]))
    fast = bench_async.resolve(parser.parse_args(["--quick", "--unmask", "threshold"]))
    for name in ("async_secagg", "async_secagg_whole", "async"):
        assert "server.group_unmask" not in bench_async.contender_values(name, plain, 0, tmp_path)
    secure = bench_async.contender_values("async_secagg", fast, 0, tmp_path)
    assert secure["server.group_unmask"] == "threshold"
    for name in ("async_secagg_whole", "async"):
        assert "server.group_unmask" not in bench_async.contender_values(name, fast, 0, tmp_path)
