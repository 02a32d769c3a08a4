"""The two pieces every per-round plot draws with: a metric's finite points by round, and
an empty figure with rounds on the x axis (Matplotlib's object API, Agg canvas)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of `key` where it is a finite number (NaN, inf, bools skipped)."""
    xs, ys = [], []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(int(row["round"]))
            ys.append(float(v))
    return xs, ys


def round_figure(title: str, ylabel: str) -> tuple[Any, Any]:
    """A figure and its axes: `title`, rounds (integers) on x, `ylabel` on y, a light grid."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax
