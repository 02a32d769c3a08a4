"""One privacy figure per adversary.

- Observers of what is published see the released models and the public run files:
  their epsilon is the ledger's, amplified by sampling while cohorts stay secret.
- The coordinator draws every cohort, so amplification never holds against it. Under
  central DP it sees the un-noised sum (a trusted curator: no epsilon). Under
  distributed DP each client's epsilon counts only the rounds it took part in,
  unamplified (individual accounting, Feldman & Zrnic 2021).

What the public report may say about the coordinator (docs/explanation/trust-model.md): only the
data-independent bound, every released round composed unamplified, which is the figure
of a client that took part in every round and is computed from the public ledger alone.
Under a participation cap (asynchronous DP: releases record `max_participations` P) a
client is in at most P releases, so the bound composes the P least-noisy releases
(participation.capped_events), as the observers' figure does.
The realised per-client figures (their largest, percentiles, histogram and the number of
clients that took part) come from the operator's private annex ("charge" records): they
are participation counts, so they go to the operator's report only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fedveil.protocol.dp_rules import CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM, DP_FTRL

from .accounting import individual_epsilon
from .events import PrivacyEvent, event_from_entry
from .individual import individual_epsilon_summary, individual_epsilons
from .participation import capped_events

CHARGE = "charge"
# The realised largest per-client figure: private annex and operator's views only.
REALISED = "epsilon_coordinator_max"
INDIVIDUAL_ACCOUNTING = (
    "individual, unamplified, from each client's own participations (Feldman & Zrnic 2021)"
)
TRUSTED_CURATOR = "a trusted curator: it sees the un-noised sum; no guarantee holds against it"
PER_CLIENT_WITHHELD = (
    "Each client's own figure (its rounds only) is at most this bound. The operator's "
    "report (private/report.html, or GET /runs/<id>/privacy/private with the admin token) "
    "gives each client's figure, their largest and their distribution; they count how "
    "often clients took part, so neither they nor the number of clients that took part "
    "are published."
)


def coordinator_figure(
    mechanism: str, releases: Sequence[Mapping[str, Any]], delta: float
) -> dict[str, Any]:
    """The public figure against the coordinator: the data-independent bound under
    distributed DP (from the ledger's releases alone), or why nothing bounds it."""
    if mechanism in (CENTRAL_GAUSSIAN, DP_FTRL):  # DP-FTRL: central, correlated noise
        return {"epsilon": None, "statement": TRUSTED_CURATOR}
    if mechanism != DISTRIBUTED_SKELLAM:
        return {
            "epsilon": None,
            "statement": f"{mechanism}: no coordinator figure is computed for this mechanism",
        }
    figure: dict[str, Any] = {"epsilon_bound": None}
    try:
        figure["epsilon_bound"] = coordinator_bound_series(releases, delta)[-1]
    except IndexError:
        figure["epsilon_bound"] = 0.0  # nothing released: nothing learnt
    except ValueError as error:  # e.g. an old ledger whose adjacency has no sound bound
        figure["bound_error"] = str(error)
    cap = recorded_cap(releases)
    figure["bound"] = (
        "a client that took part in every released round"
        if cap is None
        else f"a client in {cap} releases, the most server.max_participations allows"
    )
    figure["per_client"] = PER_CLIENT_WITHHELD
    figure["accounting"] = INDIVIDUAL_ACCOUNTING
    figure["delta"] = delta
    return figure


def recorded_cap(releases: Sequence[Mapping[str, Any]]) -> int | None:
    """The participation cap the releases record (run-constant; None: no cap, sync)."""
    cap = releases[0].get("max_participations") if releases else None
    return None if cap is None else int(cap)


def coordinator_bound_after(
    releases: Sequence[Mapping[str, Any]],
    delta: float,
    upcoming: Sequence[PrivacyEvent] = (),
    cap: int | None = None,
) -> float:
    """The unamplified epsilon of a client in every release of `releases` and in the
    `upcoming` events (under a participation cap, in the `cap` least-noisy of them; None:
    the cap the releases record): what a ledger entry and its closing record state as
    `epsilon_coordinator_bound` (ledger schema 2). 0.0 when there is nothing to compose.

    Raises ValueError where the adjacency has no sound individual bound.
    """
    events = [event_from_entry(entry) for entry in releases]
    cap = recorded_cap(releases) if cap is None else cap
    return individual_epsilon(capped_events([*events, *upcoming], cap), delta)


def coordinator_bound_series(releases: Sequence[Mapping[str, Any]], delta: float) -> list[float]:
    """After each release, the unamplified epsilon of a client in every round so far (under
    a participation cap, in as many of them as the cap allows).

    Depends only on the public ledger's parameters (z, steps, adjacency), never on who
    took part. Raises ValueError where the adjacency has no sound individual bound.
    """
    cap = recorded_cap(releases)
    events: list[PrivacyEvent] = []
    series: list[float] = []
    for entry in releases:
        events.append(event_from_entry(entry))
        series.append(individual_epsilon(capped_events(events, cap), delta))
    return series


def operator_coordinator_figure(
    public: Mapping[str, Any],
    releases: Sequence[Mapping[str, Any]],
    closing: Mapping[str, Any] | None,
    private_records: Iterable[Mapping[str, Any]],
    delta: float,
) -> dict[str, Any]:
    """The public figure plus the realised per-client figures from the private annex
    (operator's view: they reveal participation)."""
    if "epsilon_bound" not in public:
        return dict(public)  # central DP or another mechanism: nothing per client
    records = [dict(record) for record in private_records]
    charges = [r for r in records if r.get("kind") == CHARGE]
    # Ledgers of schema 1 recorded the realised max; newer runs keep it in the annex.
    recorded = _last_recorded_max([*releases, *([closing] if closing else []), *records])
    figure: dict[str, Any] = {
        **public,
        "epsilon_max": recorded,
        "distribution": None,
        "source": "recorded epsilon_coordinator_max; the annex has no charge records",
    }
    figure.pop("per_client", None)
    if charges:
        try:
            distribution = individual_epsilon_summary(_client_epsilons(charges, releases, delta))
        except ValueError as error:
            figure["source"] = f"recorded epsilon_coordinator_max; per-client accounting: {error}"
        else:
            figure.update(
                epsilon_max=distribution["max"],
                distribution=distribution,
                source="private annex (private/rounds.jsonl charge records)",
            )
            if recorded is not None:
                figure["recorded_epsilon_max"] = recorded
    return figure


def realised_series(
    releases: Sequence[Mapping[str, Any]], private_records: Iterable[Mapping[str, Any]]
) -> list[Any] | None:
    """The realised largest per-client epsilon after each release (the operator's chart):
    from the ledger where it recorded them (schema 1), else from the annex's charge
    records (one per release, in order). None when neither has them."""
    if any(REALISED in entry for entry in releases):
        return [entry.get(REALISED) for entry in releases]
    charged = [r.get(REALISED) for r in private_records if r.get("kind") == CHARGE]
    if not any(isinstance(value, (int, float)) for value in charged):
        return None
    return charged[-len(releases) :] if releases else []


def _last_recorded_max(records: Sequence[Mapping[str, Any]]) -> float | None:
    for entry in reversed(records):
        value = entry.get(REALISED)
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
