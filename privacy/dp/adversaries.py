"""One privacy figure per adversary.

- Observers of what is published see the released models and the public run files:
  their epsilon is the ledger's, amplified by sampling while cohorts stay secret.
- The coordinator draws every cohort, so amplification never holds against it. Under
  central DP it sees the un-noised sum (a trusted curator: no epsilon). Under
  distributed DP each client's epsilon counts only the rounds it took part in,
  unamplified (individual accounting, Feldman & Zrnic 2021); participations come from
  the operator's private annex ("charge" records), absent on an auditor's machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .budget import event_from_entry
from .events import PrivacyEvent
from .individual import individual_epsilon_summary, individual_epsilons
from .vocabulary import CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM

CHARGE = "charge"
INDIVIDUAL_ACCOUNTING = (
    "individual, unamplified, from each client's own participations (Feldman & Zrnic 2021)"
)
TRUSTED_CURATOR = "a trusted curator: it sees the un-noised sum; no guarantee holds against it"


def coordinator_figure(
    mechanism: str,
    releases: Sequence[Mapping[str, Any]],
    closing: Mapping[str, Any] | None,
    private_records: Iterable[Mapping[str, Any]] | None,
    delta: float,
) -> dict[str, Any]:
    """What bounds the coordinator: the per-client distribution (distributed DP), or why
    nothing does. `private_records` None means the annex is not available here."""
    if mechanism == CENTRAL_GAUSSIAN:
        return {"epsilon": None, "statement": TRUSTED_CURATOR}
    if mechanism != DISTRIBUTED_SKELLAM:
        return {
            "epsilon": None,
            "statement": f"{mechanism}: no coordinator figure is computed for this mechanism",
        }
    charges = [r for r in private_records or () if r.get("kind") == CHARGE]
    recorded = _last_recorded_max(releases, closing)
    figure = {
        "epsilon_max": recorded,
        "distribution": None,
        "source": "ledger (epsilon_coordinator_max); the private annex is not here",
    }
    if charges:
        try:
            distribution = individual_epsilon_summary(_client_epsilons(charges, releases, delta))
        except ValueError as error:  # e.g. an old ledger whose adjacency has no sound bound
            figure["source"] = f"ledger (epsilon_coordinator_max); per-client accounting: {error}"
        else:
            figure = {
                "epsilon_max": distribution["max"],
                "distribution": distribution,
                "source": "private annex (private/rounds.jsonl charge records)",
            }
            if recorded is not None:
                figure["ledger_epsilon_max"] = recorded
    figure["accounting"] = INDIVIDUAL_ACCOUNTING
    figure["delta"] = delta
    return figure


def _last_recorded_max(
    releases: Sequence[Mapping[str, Any]], closing: Mapping[str, Any] | None
) -> float | None:
    for entry in [*([closing] if closing else []), *reversed(releases)]:
        value = entry.get("epsilon_coordinator_max")
        if isinstance(value, (int, float)):
            return float(value)
    return None


def _client_epsilons(
    charges: Sequence[Mapping[str, Any]], releases: Sequence[Mapping[str, Any]], delta: float
) -> dict[int, float]:
    """Each client's unamplified epsilon over the releases it took part in."""
    by_seq = {entry.get("seq"): entry for entry in releases if entry.get("seq") is not None}
    by_round = {entry.get("training_round"): entry for entry in releases}
    events_of: dict[int, list[PrivacyEvent]] = {}
    for charge in charges:
        entry = by_seq.get(charge.get("ledger_seq")) or by_round.get(charge.get("round"))
        if entry is None and releases:
            entry = releases[-1]  # an annex ahead of this ledger copy: same run parameters
        if entry is None:
            continue
        event = event_from_entry(entry)
        for client in charge.get("survivors", []):
            events_of.setdefault(int(client), []).append(event)
    return individual_epsilons(events_of, delta)
