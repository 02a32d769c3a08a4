"""Plots of a gossip run, from its metrics.jsonl rows (simulations/plots.py draws them).

- consensus.png: consensus distance (mean distance of the clients' models to their
  average) per round, log scale
- client_accuracy.png: the consensus model's test accuracy per round, and the spread
  (min, median, max) of the scored clients' own models

Rows without the gossip keys draw nothing, so other runs' plots are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedveil.simulations.round_figures import round_figure, series

GOSSIP_PLOTS = ("consensus.png", "client_accuracy.png")


def gossip_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """name -> figure (None where the rows hold nothing to draw)."""
    xs, ys = series(rows, "consensus_distance")
    if not xs:
        return {}
    consensus, ax = round_figure("consensus distance", "mean ||x_i - average||")
    ax.plot(xs, ys, marker="o" if len(xs) < 40 else None, markersize=3)
    if all(y > 0 for y in ys):
        ax.set_yscale("log")
    accuracy, ax = round_figure("accuracy: consensus model and clients' own models", "accuracy")
    drawn = False
    rx, lo = series(rows, "client_accuracy_min")
    _, mid = series(rows, "client_accuracy_median")
    _, hi = series(rows, "client_accuracy_max")
    if rx and len(rx) == len(lo) == len(mid) == len(hi):
        ax.fill_between(rx, lo, hi, alpha=0.25, label="clients: min to max")
        ax.plot(rx, mid, linestyle="--", label="clients: median")
        drawn = True
    ax_x, acc = series(rows, "test_accuracy")
    if ax_x:
        ax.plot(ax_x, acc, label="consensus (average) model")
        drawn = True
    if drawn:
        ax.legend()
    return {"consensus.png": consensus, "client_accuracy.png": accuracy if drawn else None}
