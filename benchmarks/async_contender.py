"""One contender of `fedveil bench async`, in its own process (so the parent reads its CPU
time, worker processes included, from the OS).

    python -m fedveil.benchmarks.async_contender SPEC.json RESULT.json

SPEC: {"values": {config key: value}, "target": accuracy, "stop_at_target": bool}. The run
stops at the first evaluation that reaches the target (the rest of the run would only
cost time); RESULT gets every round record (metrics.jsonl's lines) and whether the
target was reached. Plots are left to the parent (their drawing is not the run's CPU).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from fedveil.benchmarks.harness import contender_main
from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate


class TargetReached(Exception):
    """Raised from on_round to end the run at the first evaluation at the target."""


def run(spec: dict[str, Any]) -> dict[str, Any]:
    cfg = load_config(None, spec["values"])
    target, stop = float(spec["target"]), bool(spec.get("stop_at_target", True))
    records: list[dict[str, Any]] = []

    def on_round(record: Any) -> None:
        records.append(record.to_json())
        acc = record.test_accuracy
        if stop and acc is not None and acc >= target:
            raise TargetReached

    start = time.perf_counter()
    reached_early = False
    try:
        simulate(cfg, on_round=on_round)
    except TargetReached:
        reached_early = True
    wall = time.perf_counter() - start
    return {
        "records": records,
        "stopped_at_target": reached_early,
        "wall_s": round(wall, 3),
    }


if __name__ == "__main__":
    sys.exit(contender_main(run, sys.argv[1:]))
