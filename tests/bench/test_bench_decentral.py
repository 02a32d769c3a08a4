"""`fedveil bench decentral`: the secure all-reduce's figures, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.procs
def test_the_json_has_the_ratios_and_every_contenders_span_cpu_and_bytes():
    cmd = [sys.executable, "-m", "fedveil.cli", "bench", "decentral"]
    cmd += ["--part", "allreduce", "--silos", "3", "--dim", "20000", "--repeats", "1", "--json"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    figures = result["secure_allreduce"]
    contenders = figures["contenders"]
    assert set(contenders) == {"plain", "secure", "secure_pipelined", "coordinator"}
    for name, f in contenders.items():
        assert f["span_s"] > 0 and f["bytes_per_silo"] > 0, name
    secure = contenders["secure"]
    # in the span only what needs the update; keys, masks and the rounding randomness
    # before it, reported apart
    assert set(secure["cpu_s_per_silo"]) == {
        "encode_mask", "collective", "commit", "decode", "total"
    }  # fmt: skip
    before = secure["cpu_s_per_silo_before_span"]
    assert {"keys", "masks", "rounding", "buffers", "total"} == set(before)
    assert all(v > 0 for v in before.values())
    # a ring all-reduce sends 2 (N - 1) / N of the int32 vector (d + 2 coordinates)
    assert secure["bytes_per_silo"] == 2 * 2 * (20_000 + 2) * 4 // 3
    assert result["secure_overhead_ratio"] == secure["span_s"] / contenders["plain"]["span_s"]
    ratio = contenders["coordinator"]["span_s"] / secure["span_s"]
    assert result["vs_coordinator_ratio"] == ratio
    assert set(figures["bytes_per_node"]) == set(contenders)
    assert result["bytes_per_node"] == {
        f"allreduce_{k}": v for k, v in figures["bytes_per_node"].items()
    }
    assert result["gossip"] is None and result["gossip_updates_ratio"] is None  # not run
