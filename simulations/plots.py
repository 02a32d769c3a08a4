"""PNG plots of a run, drawn from its metrics.jsonl (so any run directory can be re-plotted).

- accuracy.png: test and federated accuracy per round
- loss.png: training, test and federated loss per round
- participation.png: clients planned, aggregated and lost per round (dropouts,
  stragglers and other failures when the availability model recorded them)
- epsilon.png: privacy spent per round, when DP metrics carry an epsilon
- staleness.png, in_flight.png: asynchronous runs only (simulations/async_plots.py)
- consensus.png, client_accuracy.png: gossip runs only (simulations/gossip_plots.py)

Matplotlib's object API with the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedveil.simulations.async_plots import ASYNC_PLOTS, async_figures
from fedveil.simulations.gossip_plots import GOSSIP_PLOTS, gossip_figures
from fedveil.simulations.round_figures import round_figure, series

PLOTS = (
    "accuracy.png",
    "loss.png",
    "participation.png",
    "epsilon.png",
    *ASYNC_PLOTS,
    *GOSSIP_PLOTS,
)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def epsilon_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Numeric metrics whose name mentions epsilon (whatever the DP layer calls them)."""
    keys = {k for row in rows for k, v in row.items() if "epsilon" in k.lower()}
    return sorted(k for k in keys if series(rows, k)[0])


def _lines(
    rows: Sequence[dict[str, Any]], keys: Sequence[tuple[str, str]], title: str, ylabel: str
) -> Any | None:
    drawn = [(label, *series(rows, key)) for key, label in keys]
    drawn = [d for d in drawn if d[1]]
    if not drawn:
        return None
    fig, ax = round_figure(title, ylabel)
    for label, xs, ys in drawn:
        ax.plot(xs, ys, marker="o" if len(xs) < 40 else None, markersize=3, label=label)
    ax.legend()
    return fig


def _participation(rows: Sequence[dict[str, Any]]) -> Any | None:
    # A DP run publishes no counts (they reveal participation): no chart of them.
    if not rows or "cohort_aggregated" not in rows[0]:
        return None
    fig, ax = round_figure("participation", "clients")
    rounds = [int(r["round"]) for r in rows]
    aggregated = [int(r.get("cohort_aggregated", 0)) for r in rows]
    dropouts = [int(r.get("sim_dropouts", 0)) for r in rows]
    stragglers = [int(r.get("sim_stragglers", 0)) for r in rows]
    other = [
        max(0, int(r.get("dropped", 0)) - d - s)
        for r, d, s in zip(rows, dropouts, stragglers, strict=True)
    ]
    bottom = list(aggregated)
    width = 0.8 if len(rounds) < 60 else 1.0
    ax.bar(rounds, aggregated, width=width, color="tab:green", label="aggregated")
    for values, color, label in (
        (dropouts, "tab:red", "dropped out"),
        (stragglers, "tab:orange", "straggled past the deadline"),
        (other, "tab:gray", "failed otherwise"),
    ):
        if any(values):
            ax.bar(rounds, values, width=width, bottom=bottom, color=color, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    planned = [int(r.get("cohort_planned", 0)) for r in rows]
    ax.step(rounds, planned, where="mid", color="black", linewidth=1, label="sampled")
    ax.set_ylim(0, max([*planned, *bottom, 1]) * 1.08)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def save_plots(run_dir: str | Path) -> list[Path]:
    """Draw every plot the run's metrics allow; returns the files written."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    figures = {
        "accuracy.png": _lines(
            rows,
            [("test_accuracy", "test"), ("federated_accuracy", "federated (client holdout)")],
            "accuracy",
            "accuracy",
        ),
        "loss.png": _lines(
            rows,
            [
                ("train_loss", "training (clients)"),
                ("test_loss", "test"),
                ("federated_loss", "federated (client holdout)"),
            ],
            "loss",
            "loss",
        ),
        "participation.png": _participation(rows),
        "epsilon.png": _lines(
            rows, [(k, k) for k in epsilon_keys(rows)], "privacy spent", "epsilon"
        ),
        **async_figures(rows),
        **gossip_figures(rows),
    }
    written = []
    for name, fig in figures.items():
        if fig is not None:
            path = run_dir / name
            fig.savefig(path)
            written.append(path)
    return written
