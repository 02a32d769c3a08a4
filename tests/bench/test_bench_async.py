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
    # async_secagg, the best design measured by default: groups of G = K + ceil(0.9 K) = 6
    # (at most C) released at R = K = 3, the threat model's dropouts covering the three
    # members left out; whole groups: G = K, no release.
    secure, whole = cfg["async_secagg"], cfg["async_secagg_whole"]
    assert secure["secagg.enabled"] and secure["server.group_size"] == 6
    assert secure["server.group_release_at"] == 3 and secure["secagg.dropout_rate"] == 0.5
    assert whole["server.group_size"] == 3 and "server.group_release_at" not in whole
    # Dispatched once S = ceil(0.8 R) = 3 slots are free, the others as slots free, each on
    # the model of its own start, the unmask ended at t; whole groups at once, as before.
    assert secure["server.group_dispatch_at"] == 3 and "server.group_dispatch_at" not in whole
    assert secure["server.group_member_model"] == "start"
    assert secure["server.group_unmask"] == "threshold"
    assert "server.group_member_model" not in whole and "server.group_unmask" not in whole
    assert summary["peer"]["time_to_target_ratio"] == 3.0
    assert "time_to_target_ratio" in done.stderr  # the human table goes to stderr under --json


def test_a_secagg_group_too_small_for_the_protocol_is_refused_by_name(tmp_path, fedveil_cli):
    done = fedveil_cli(
        "bench", "async", "--quick", "--buffer", "2", "--group-size", "2", "--out", str(tmp_path)
    )
    assert done.returncode != 0
    assert "--group-size = 2: must be in [max(3, --buffer = 2), --concurrency = 6]" in done.stderr
    assert not (tmp_path / "seed0").exists()  # refused before any contender ran


def parse(*flags: str):
    import argparse

    from fedveil.benchmarks import bench_async

    parser = argparse.ArgumentParser()
    bench_async.add_async_arguments(parser)
    return bench_async.resolve(parser.parse_args(list(flags)))


def test_the_defaults_are_the_best_design_measured_within_the_threat_model(tmp_path):
    """`fedveil bench async` with no flags runs async_secagg as the design that reached
    secagg_overhead_ratio 1.64 (G = 19, S = 8, late members on the model of their start,
    unmask at t; docs/explanation/performance.md), and only where the group's threat model
    holds: R = 10 >= K, the dropout rate covering the G - R left out, t and k derived for
    G with a complete graph (what the unmask at t needs). The other contenders are as
    before: async on the same seed, workload and C, K."""
    from fedveil.benchmarks import bench_async
    from fedveil.config import load_config
    from fedveil.privacy.secagg.params import ThreatModel, find_parameters

    s = parse()
    assert (s.concurrency, s.buffer, s.group_size, s.release_at, s.dispatch_at) == (
        20, 10, 19, 10, 8
    )  # fmt: skip
    assert (s.member_model, s.unmask, s.start_order) == ("start", "threshold", "client_id")
    secure = bench_async.contender_values("async_secagg", s, 0, tmp_path / "s")
    assert secure["server.group_release_at"] >= secure["server.buffer"]  # R >= K
    g, r, dropout = 19, 10, secure["secagg.dropout_rate"]
    assert dropout >= (g - r) / g  # the members left out by design are the model's dropouts
    graph = find_parameters(g, ThreatModel(0.05, dropout))
    assert graph.complete and graph.threshold <= r  # t replies hold a share of every secret
    cfg = load_config(None, {k: v for k, v in secure.items() if k != "seed"})  # valid config
    assert cfg.server.group_unmask == "threshold" and cfg.server.group_member_model == "start"
    plain = bench_async.contender_values("async", s, 0, tmp_path / "a")
    for key in ("seed", "server.concurrency", "server.buffer", "server.rounds",
                "simulation.latency_median", "eval.central_every"):  # fmt: skip
        assert plain[key] == secure[key], key
    assert not any(k.startswith(("secagg.", "server.group_")) for k in plain)
    # --release-at 0: whole groups at once, every survivor's unmask (as async_secagg_whole)
    whole = parse("--release-at", "0")
    assert (whole.group_size, whole.dispatch_at, whole.member_model, whole.unmask) == (
        10, 0, "dispatch", "survivors"
    )  # fmt: skip


def test_the_late_member_flags_reach_the_rolling_secure_contender_only(tmp_path):
    """--member-model and --start-order (server.group_member_model, group_start_order)
    configure async_secagg's rolling groups only; --member-model dispatch leaves the
    group's model to every member, as the design before."""
    from fedveil.benchmarks import bench_async

    plain = parse("--quick", "--member-model", "dispatch")
    late = parse("--quick", "--start-order", "random")
    for name in ("async_secagg", "async_secagg_whole", "async"):
        before = bench_async.contender_values(name, plain, 0, tmp_path)
        assert "server.group_member_model" not in before
        assert "server.group_start_order" not in before
    secure = bench_async.contender_values("async_secagg", late, 0, tmp_path)
    assert secure["server.group_member_model"] == "start"
    assert secure["server.group_start_order"] == "random"
    whole = bench_async.contender_values("async_secagg_whole", late, 0, tmp_path)
    assert "server.group_member_model" not in whole and "server.group_start_order" not in whole
    # Without rolling dispatch the members all start at once: the group's model.
    assert parse("--quick", "--dispatch-at", "0").member_model == "dispatch"


def test_the_unmask_flag_reaches_the_secure_contender_only(tmp_path):
    """--unmask (server.group_unmask) sets async_secagg's unmask stage only; threshold by
    default, survivors waits for every survivor's shares as the design before."""
    from fedveil.benchmarks import bench_async

    slow = parse("--quick", "--unmask", "survivors")
    fast = parse("--quick")
    for name in ("async_secagg", "async_secagg_whole", "async"):
        assert "server.group_unmask" not in bench_async.contender_values(name, slow, 0, tmp_path)
    secure = bench_async.contender_values("async_secagg", fast, 0, tmp_path)
    assert secure["server.group_unmask"] == "threshold"
    for name in ("async_secagg_whole", "async"):
        assert "server.group_unmask" not in bench_async.contender_values(name, fast, 0, tmp_path)
