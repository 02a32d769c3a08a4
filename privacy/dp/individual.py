"""Per-client (individual) epsilon against the coordinator under distributed DP.

The coordinator draws every cohort, so amplification by sampling never holds against
it. Each client's epsilon composes only the releases it took part in, unamplified
(accounting.individual_epsilon). Clients with the same multiset of events share one
computation: with a constant z per round, epsilon depends only on the participation
count, so 1000 clients cost a handful of accountant calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from fedveil.protocol.dp_rules import POISSON

from .accounting import individual_epsilon
from .events import PrivacyEvent, group_events

HISTOGRAM_BINS = 10


def individual_epsilons(
    participations: Mapping[int, Sequence[PrivacyEvent]], delta: float
) -> dict[int, float]:
    """Epsilon of every client from its own events (the rounds it took part in)."""
    memo: dict[tuple[PrivacyEvent, ...], float] = {}
    result: dict[int, float] = {}
    for client, events in participations.items():
        key = _canonical(events)
        if key not in memo:
            memo[key] = individual_epsilon(key, delta)
        result[client] = memo[key]
    return result


def individual_epsilon_summary(
    epsilons: Mapping[int, float], bins: int = HISTOGRAM_BINS
) -> dict[str, Any]:
    """{"max", "p50", "p90", "clients", "histogram"} of per-client epsilons, for a report.

    Percentiles are nearest-rank (a value some client actually has). The histogram has
    `bins` equal-width bins over [0, max]: [{"lo", "hi", "clients"}, ...].
    """
    if not (isinstance(bins, int) and bins >= 1):
        raise ValueError(f"bins={bins!r} is invalid; allowed: an integer >= 1")
    values = sorted(float(v) for v in epsilons.values())
    if not values:
        return {"max": 0.0, "p50": 0.0, "p90": 0.0, "clients": 0, "histogram": []}
    top = values[-1]
    finite = [v for v in values if math.isfinite(v)]
    edges = np.linspace(0.0, max(finite, default=0.0) or 1.0, bins + 1)
    counts, _ = np.histogram(finite, bins=edges)
    histogram = [
        {"lo": float(lo), "hi": float(hi), "clients": int(n)}
        for lo, hi, n in zip(edges[:-1], edges[1:], counts, strict=True)
    ]
    if len(finite) < len(values):
        histogram.append({"lo": math.inf, "hi": math.inf, "clients": len(values) - len(finite)})
    return {
        "max": top,
        "p50": _nearest_rank(values, 0.5),
        "p90": _nearest_rank(values, 0.9),
        "clients": len(values),
        "histogram": histogram,
    }


def coordinator_epsilon_after(max_participations: int, event: PrivacyEvent, delta: float) -> float:
    """The worst client's epsilon against the coordinator if it also takes part in `event`.

    Call BEFORE a round, with the most participations any client has so far. Exact when
    every round has the same z; when z varies (dropouts), pass the smallest z the run
    may release with (e.g. at min_clients survivors), which upper-bounds every round, or
    use `individual_epsilon([*client_events, event], delta)` for one client's exact value.
    """
    if not (isinstance(max_participations, int) and max_participations >= 0):
        raise ValueError(
            f"max_participations={max_participations!r} is invalid; allowed: an integer >= 0"
        )
    composed = replace(event, steps=event.steps * (max_participations + 1))
    return individual_epsilon([composed], delta)


def _canonical(events: Sequence[PrivacyEvent]) -> tuple[PrivacyEvent, ...]:
    # q does not matter for individual accounting: clients whose events differ only in
    # it share one computation.
    return group_events(
        replace(event, sampling_rate=1.0, sampling=POISSON, population_size=None)
        for event in events
    )


def _nearest_rank(sorted_values: Sequence[float], fraction: float) -> float:
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]
