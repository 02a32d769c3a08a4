"""Plots of asynchronous training (server.mode async or ssp), from metrics.jsonl rows.

- staleness.png: histogram of the staleness tau of every applied update, stale drops noted
- in_flight.png: updates in flight at each applied version, over simulated time
- accuracy_over_time(runs): test accuracy over simulated seconds, one line per run (the
  async benchmark draws async next to sync with it)

A run's simulated clock is its `sim_clock_s`, or the running sum of `sim_time_s` (sync
rounds recorded before `sim_clock_s` existed). Rows without the async keys draw nothing,
so a sync run's plots are unchanged.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ASYNC_PLOTS = ("staleness.png", "in_flight.png")


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def sim_clock(rows: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Each row's simulated time since the run began, or None where the run has no clock."""
    clock: list[float | None] = []
    total = 0.0
    for row in rows:
        at, step = _number(row.get("sim_clock_s")), _number(row.get("sim_time_s"))
        if at is not None:
            total = at
        elif step is not None:
            total += step
        else:
            clock.append(None)
            continue
        clock.append(total)
    return clock


def time_to_target(rows: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """Simulated seconds until test accuracy first reached `target`; None if it never did."""
    for row, at in zip(rows, sim_clock(rows), strict=True):
        acc = _number(row.get("test_accuracy"))
        if acc is not None and acc >= target and at is not None:
            return at
    return None


def staleness_values(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """The staleness of every applied update, over the whole run."""
    taus: list[int] = []
    for row in rows:
        value = row.get("staleness")
        if isinstance(value, list):
            taus.extend(int(t) for t in value if _number(t) is not None)
    return taus


def _figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def staleness_histogram(rows: Sequence[Mapping[str, Any]]) -> Any | None:
    """Bars: how many applied updates had each staleness tau (versions since download)."""
    taus = staleness_values(rows)
    if not taus:
        return None
    counts = Counter(taus)
    dropped = sum(int(_number(r.get("stale_dropped")) or 0) for r in rows)
    mean = sum(taus) / len(taus)
    title = f"staleness of applied updates ({len(taus)} updates, mean tau {mean:.2f}"
    title += f", {dropped} dropped as too stale)" if dropped else ")"
    fig, ax = _figure(title, "staleness tau (model versions since download)", "updates")
    xs = sorted(counts)
    ax.bar(xs, [counts[x] for x in xs], width=0.8, color="tab:blue")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def in_flight_over_time(rows: Sequence[Mapping[str, Any]]) -> Any | None:
    """Steps: clients training at each applied version, against simulated time (or version)."""
    points = [
        (row, at)
        for row, at in zip(rows, sim_clock(rows), strict=True)
        if _number(row.get("in_flight")) is not None
    ]
    if not points:
        return None
    timed = all(at is not None for _, at in points)
    xs = [at if timed else float(row["round"]) for row, at in points]
    ys = [_number(row["in_flight"]) for row, _ in points]
    xlabel = "simulated time (s)" if timed else "model version"
    fig, ax = _figure("updates in flight at each applied version", xlabel, "clients in flight")
    ax.step(xs, ys, where="post", color="tab:purple")
    ax.set_ylim(0, max([y or 0.0 for y in ys] + [1.0]) * 1.1)
    return fig


def accuracy_over_time(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], target: float | None = None
) -> Any | None:
    """Test accuracy against simulated seconds, one line per named run (sync next to async)."""
    fig = None
    for label, rows in runs.items():
        points = [
            (at, _number(row.get("test_accuracy")))
            for row, at in zip(rows, sim_clock(rows), strict=True)
        ]
        points = [(at, acc) for at, acc in points if at is not None and acc is not None]
        if not points:
            continue
        if fig is None:
            fig, ax = _figure("test accuracy over simulated time", "simulated time (s)", "accuracy")
        marker = "o" if len(points) < 40 else None
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, ms=3, label=label)
    if fig is None:
        return None
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.legend()
    return fig


def async_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any | None]:
    """The run-directory plots of an async run (None where the rows do not allow one)."""
    return {
        "staleness.png": staleness_histogram(rows),
        "in_flight.png": in_flight_over_time(rows),
    }


def save_figure(fig: Any, path: Path) -> Path:
    fig.savefig(path)
    return path
