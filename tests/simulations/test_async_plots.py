"""Plots of asynchronous runs: the simulated clock, time to target, and the run's PNGs."""

from __future__ import annotations

import json
from pathlib import Path

from fedveil.simulations.async_plots import (
    accuracy_over_time,
    sim_clock,
    staleness_values,
    time_to_target,
)
from fedveil.simulations.plots import save_plots

ASYNC_ROWS = [
    {
        "round": v,
        "applied": True,
        "cohort_aggregated": 3,
        "dropped": 0,
        "mode": "async",
        "staleness": taus,
        "stale_dropped": v % 2,
        "in_flight": 6,
        "sim_time_s": 0.5,
        "sim_clock_s": 0.5 * v,
        "test_accuracy": acc,
        "train_loss": 1.0,
    }
    for v, (taus, acc) in enumerate(
        [([0, 0, 0], None), ([0, 1, 1], 0.5), ([2, 1, 0], None), ([3, 1, 1], 0.81)], start=1
    )
]
# Sync rounds recorded before sim_clock_s existed: only the per-round sim_time_s.
SYNC_ROWS = [
    {"round": r, "sim_time_s": t, "test_accuracy": a, "cohort_aggregated": 6}
    for r, t, a in [(1, 4.0, 0.4), (2, 6.0, 0.79), (3, 5.0, 0.8)]
]


def write(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_the_clock_is_sim_clock_s_or_the_sum_of_round_times():
    assert sim_clock(ASYNC_ROWS) == [0.5, 1.0, 1.5, 2.0]
    assert sim_clock(SYNC_ROWS) == [4.0, 10.0, 15.0]
    assert sim_clock([{"round": 1, "test_accuracy": 0.9}]) == [None]  # no latency model


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    assert time_to_target(ASYNC_ROWS, 0.8) == 2.0
    assert time_to_target(SYNC_ROWS, 0.8) == 15.0  # 0.79 at 10 s is not yet there
    assert time_to_target(SYNC_ROWS, 0.95) is None
    assert staleness_values(ASYNC_ROWS) == [0, 0, 0, 0, 1, 1, 2, 1, 0, 3, 1, 1]


def test_an_async_run_gets_staleness_and_in_flight_plots_and_a_sync_run_does_not(tmp_path):
    written = {p.name for p in save_plots(write(tmp_path / "async", ASYNC_ROWS))}
    assert {"staleness.png", "in_flight.png", "accuracy.png"} <= written
    assert not {"staleness.png", "in_flight.png"} & {
        p.name for p in save_plots(write(tmp_path / "sync", SYNC_ROWS))
    }


def test_accuracy_over_time_draws_one_line_per_run_and_the_target():
    fig = accuracy_over_time({"sync": SYNC_ROWS, "async": ASYNC_ROWS}, 0.8)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"sync", "async", "target 0.8"}
    assert list(lines["async"].get_xdata()) == [1.0, 2.0]  # evaluated versions only
    assert list(lines["sync"].get_xdata()) == [4.0, 10.0, 15.0]
    assert accuracy_over_time({"no clock": [{"round": 1, "test_accuracy": 0.5}]}) is None
