"""A dashboard's poll of a long run's rounds: the paged index against reading the file.

    .venv/bin/python -m fedveil.benchmarks.bench_rounds_poll --json [--rounds 1000 20000]

For each run length, a metrics.jsonl of that many round records (as the engine writes
them, ~300 bytes each) in a temporary directory, then the poll a dashboard makes once
it holds every round (the rounds after the last one) timed back to back, both ways in
the same run:

- whole_file: what GET /runs/{id}/rounds did before (RunDir.metrics: parse every line,
  then keep the rounds after `since`);
- paged_index: RoundIndex.page (server/coordinator/round_index.py), after its first
  request has indexed the file, as a coordinator's is after the first poll; each timed
  poll appends one round first, so it also pays for indexing what is new.

Figures: the median seconds per poll of each, and whole_file / paged_index.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedveil.server.coordinator.round_index import RoundIndex
from fedveil.server.coordinator.rundir import RunDir


def _record(r: int) -> dict[str, Any]:
    return {
        "round": r,
        "status": "applied",
        "applied": True,
        "cohort_planned": 100,
        "cohort_aggregated": 97,
        "dropped": 3,
        "drops_by_reason": {"timeout": 2, "norm_bound": 1},
        "duration_s": 12.345678,
        "test_accuracy": 0.8123456,
        "test_loss": 0.5123456,
        "train_loss": 0.4987654,
        "clip_norm": 1.0,
        "noise_multiplier": 0.0,
    }


def _whole_file(state: Path, run_id: str, since: int) -> list[dict[str, Any]]:
    return [r for r in RunDir(state, run_id).metrics() if int(r.get("round", 0)) > since]


def measure(rounds: int, polls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        state, run_id = Path(tmp), "20260101-000000-aaaaaa"
        run = state / "runs" / run_id
        run.mkdir(parents=True)
        path = run / "metrics.jsonl"
        path.write_text("".join(json.dumps(_record(r)) + "\n" for r in range(1, rounds + 1)))
        index = RoundIndex()
        index.page(path, 0, 1000)  # the first poll indexes the file
        whole, paged = [], []
        last = rounds
        for _ in range(polls):
            with path.open("a") as f:
                f.write(json.dumps(_record(last + 1)) + "\n")
            t = time.perf_counter()
            a = _whole_file(state, run_id, last)
            whole.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = index.page(path, last, 1000)
            paged.append(time.perf_counter() - t)
            assert a == b and [r["round"] for r in a] == [last + 1], (a, b)
            last += 1
        w, p = statistics.median(whole), statistics.median(paged)
        return {
            "rounds": rounds,
            "whole_file_s": w,
            "paged_index_s": p,
            "whole_file_over_paged_index": w / p,
        }


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[1000, 20000])
    parser.add_argument("--polls", type=int, default=15, help="timed polls per run length")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    results = [measure(n, args.polls) for n in args.rounds]
    if args.json:
        print(json.dumps({"benchmark": "rounds_poll", "results": results}, indent=2))
    else:
        for r in results:
            print(
                f"{r['rounds']:>7} rounds: whole file {r['whole_file_s'] * 1e3:.2f} ms, "
                f"paged index {r['paged_index_s'] * 1e3:.3f} ms, "
                f"ratio {r['whole_file_over_paged_index']:.0f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
