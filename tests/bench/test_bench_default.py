"""`fedveil bench default`: the default job against the bare torch loop, as a user runs it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "bare_final_accuracy",
    "ours_final_accuracy",
    "bare_time_to_85_s",
    "ours_time_to_85_s",
    "time_to_85_ratio",
}
LOCAL = ("model", "clients", "per_round", "rounds", "local_epochs", "batch_size", "lr", "momentum")


@pytest.mark.procs
@pytest.mark.timeout(600)
def test_bench_default_runs_both_contenders_on_the_same_job() -> None:
    # Digits (its own defaults: the MLP on 20 clients) for 3 rounds: the real command,
    # both contenders in their own processes, in seconds rather than the job's minutes.
    cmd = [sys.executable, "-m", "fedveil.cli", "bench", "default", "--json"]
    cmd += ["--set", "data.dataset=digits", "--set", "server.rounds=3"]
    cmd += ["--set", "server.per_round=5"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(s) >= KEYS
    bare, ours = s["bare_config"], s["ours_config"]
    assert bare["model"] == "mlp" and bare["clients"] == 20  # digits' own defaults, for both
    assert {k: bare[k] for k in LOCAL} == {k: ours[k] for k in LOCAL}
    assert len(s["bare_accuracy"]) == len(s["ours_accuracy"]) == 3
    # Both learned something (10 classes: chance is 0.1).
    assert s["bare_final_accuracy"] > 0.3 and s["ours_final_accuracy"] > 0.3
    for who in ("bare", "ours"):
        t = s[f"{who}_time_to_85_s"]
        assert t is None or 0 < t < s[f"{who}_end_to_end_s"]
    if s["bare_time_to_85_s"] and s["ours_time_to_85_s"]:
        assert math.isclose(s["time_to_85_ratio"], s["ours_time_to_85_s"] / s["bare_time_to_85_s"])
    assert "time to 85%" in done.stderr  # the human table goes to stderr under --json


def test_time_to_target_is_the_first_round_at_or_above_it_and_nan_never_is() -> None:
    sys.path.insert(0, str(ROOT))
    from fedveil.benchmarks.bench_default import time_to

    run = {"time_s": [1.0, 2.0, 3.0, 4.0], "accuracy": [0.5, math.nan, 0.85, 0.9]}
    assert time_to(run, 0.85) == (3.0, 3)
    assert time_to({"time_s": [1.0], "accuracy": [math.nan]}, 0.85) == (None, None)
