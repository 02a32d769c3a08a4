"""The benchmark harness's contender runner (benchmarks/harness.py), the one piece every
benchmark launches its contenders with: a fresh process timed from its launch, the peak
memory of its process tree, and a time limit that ends it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedveil.benchmarks.harness import ContenderFailed, run_contender

CONTENDER = """
import sys, time
from fedveil.benchmarks.harness import contender_main, since_launch

def run(spec):
    held = bytearray(spec["hold_mb"] << 20)  # touched: resident, not just reserved
    for i in range(0, len(held), 4096):
        held[i] = 1
    time.sleep(spec["sleep_s"])
    return {"since_launch_s": since_launch(), "held": len(held)}

if __name__ == "__main__":
    sys.exit(contender_main(run, sys.argv[1:]))
"""


@pytest.fixture
def contender_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "harness_probe.py").write_text(CONTENDER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the contender's environment is ours
    return "harness_probe"


@pytest.mark.procs
def test_a_contender_is_timed_from_its_launch_with_its_peak_memory(
    contender_module: str, tmp_path: Path
) -> None:
    spec = {"hold_mb": 120, "sleep_s": 0.5}
    before = time.time()
    done = run_contender(contender_module, spec, tmp_path / "work", watch_memory=True)
    after = time.time()
    assert done["held"] == 120 << 20
    # The child's own clock starts at its launch: start-up and the sleep are in it.
    assert 0.5 < done["since_launch_s"] < done["process_wall_s"]
    # Launched, not ended: a whole process_wall_s (> 0.5 s) before the call returned,
    # however long a loaded machine took around it (0.1 s: the two clocks' rounding).
    assert before <= done["launched_at"] <= after - done["process_wall_s"] + 0.1
    assert done["peak_rss_mb"] > 120 and done["processes"] >= 1
    plain = run_contender(contender_module, {"hold_mb": 1, "sleep_s": 0}, tmp_path / "plain")
    assert "peak_rss_mb" not in plain and plain["cpu_s"] >= 0


@pytest.mark.procs
def test_a_contender_past_its_time_limit_is_ended_and_named(
    contender_module: str, tmp_path: Path
) -> None:
    start = time.perf_counter()
    with pytest.raises(ContenderFailed, match=r"no result within 1\.5 s"):
        run_contender(contender_module, {"hold_mb": 1, "sleep_s": 60}, tmp_path, timeout_s=1.5)
    assert time.perf_counter() - start < 30
