"""What one round leaves behind: its RoundRecord, and which of its keys a DP run may publish."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RoundRecord:
    round: int
    cohort_planned: int
    cohort_aggregated: int
    dropped: int
    applied: bool
    train_loss: float | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None
    federated_loss: float | None = None
    federated_accuracy: float | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d

    def public_json(self) -> dict[str, Any]:
        """What a DP run may publish about the round: accounted figures and the server's
        own evaluation. Counts, drops, client losses and federated metrics come from
        clients' data or reveal participation: they go to the private annex only."""
        full = self.to_json()
        return {k: v for k, v in full.items() if k in PUBLIC_UNDER_DP}


# Round-record keys a DP run publishes (metrics.jsonl, the API, the dashboard).
# Never the drop counts (`dropped`, `drops_by_reason`): they reveal participation, as
# does the realised `epsilon_coordinator_max` (the busiest client's participations);
# `epsilon_coordinator_bound` (a client in every released round) reveals nothing.
# Nor the simulation's `dp_sgd_epsilon_max`: the busiest client's DP-SGD epsilon inverts
# to its exact example count. DP-SGD runs alone publish only these keys too.
# Nor `duration_s`: a round lasts as long as its slowest sampled client, so its duration
# reveals the cohort (privacy/dp/public_time.py); the private annex keeps it.
PUBLIC_UNDER_DP = frozenset(
    {
        "round",
        "status",
        "test_loss",
        "test_accuracy",
        "epsilon",
        "epsilon_coordinator_bound",
        "clip_norm",
        "next_clip_norm",
        "noise_multiplier",
        "secagg_threat",
        "secagg_neighbors",
        "secagg_threshold",
        "clients_connected",
    }
)


# summary.json keys a DP run does not write: a run's wall time composes every round's
# duration (privacy/dp/public_time.py). The in-memory summary (the CLI's last line) keeps
# them for the operator.
TIMING_KEYS = ("wall_s", "attempt_wall_s")


def public_summary(summary: dict[str, Any], *, dp: bool) -> dict[str, Any]:
    """The summary as summary.json publishes it: under DP without the run's timing."""
    if not dp:
        return summary
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}
