"""`fedveil bench gossip --quick`: the keys of issue 34, as a user runs it (a real process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_quick_bench_reports_the_issue_keys(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "fedveil.cli", "bench", "gossip", "--quick", "--json",
           "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    runs = summary["contenders"]
    assert set(runs) == {"fedavg", "gossip_ring", "gossip_exponential"}
    # Equal training compute: every contender spent the same client updates.
    assert {r["client_updates"] for r in runs.values()} == {80}
    assert runs["fedavg"]["rounds"] == 20 and runs["gossip_ring"]["rounds"] == 4
    for key in ("gossip_updates_ratio", "gossip_accuracy_gap", "ring_spectral_gap"):
        assert key in summary
    assert set(summary["bytes_per_node"]) == set(runs)
    # A ring node sends its model to 2 neighbours a round, an exponential one to more.
    assert (
        summary["bytes_per_node"]["gossip_ring"] < summary["bytes_per_node"]["gossip_exponential"]
    )
    assert 0 < summary["ring_spectral_gap"] < summary["exponential_spectral_gap"] < 1
    spread = runs["gossip_ring"]["client_accuracy_spread"]
    assert spread["min"] <= spread["median"] <= spread["max"]
    assert "gossip_updates_ratio" in done.stderr  # the human table goes to stderr
