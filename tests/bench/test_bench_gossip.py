"""`fedveil bench decentral --quick`: both parts in one command, the JSON with the issue's
four keys and every contender's bytes per node, as a user runs it (a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_one_command_reports_the_issue_keys_of_both_parts(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fedveil.cli", "bench", "decentral", "--json", "--out",
           str(tmp_path), "--silos", "3", "--dim", "2000", "--repeats", "1",
           "--quick", "--lr-grid", "0.05,0.2", "--tune-updates", "40"]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("secure_overhead_ratio", "vs_coordinator_ratio", "gossip_accuracy_gap"):
        assert isinstance(result[key], float), key
    assert "gossip_updates_ratio" in result  # None when a contender missed the target
    assert set(result["bytes_per_node"]) == {
        "allreduce_plain", "allreduce_secure", "allreduce_secure_pipelined",
        "allreduce_coordinator", "gossip_fedavg", "gossip_gossip_ring",
        "gossip_gossip_exponential",
    }  # fmt: skip
    summary = result["gossip"]
    runs = summary["contenders"]
    # Equal training compute: every contender spent the same client updates, and a
    # randomized gossip round wakes FedAvg's cohort (4 of 20 clients).
    assert {r["client_updates"] for r in runs.values()} == {80}
    assert runs["fedavg"]["rounds"] == 20 and runs["gossip_ring"]["rounds"] == 20
    assert runs["gossip_ring"]["active_per_round"] == 4
    # Each lr was picked from the same grid, on the validation half.
    for r in runs.values():
        assert set(r["tuning"]["grid"]) == {"0.05", "0.2"} and r["lr"] == r["tuning"]["lr"]
    assert summary["evaluated_on"].startswith("test half")
    # A ring node sends its model to 2 neighbours a round, an exponential one to more.
    assert (
        summary["bytes_per_node"]["gossip_ring"] < summary["bytes_per_node"]["gossip_exponential"]
    )
    assert 0 < summary["ring_spectral_gap"] < summary["exponential_spectral_gap"] < 1
    spread = runs["gossip_ring"]["client_accuracy_spread"]
    assert spread["min"] <= spread["median"] <= spread["max"]
    assert "gossip_updates_ratio" in done.stderr  # the human table goes to stderr
