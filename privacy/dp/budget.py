"""Privacy budget: accountant state, pre-round checks and ledger-backed recording."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .accounting import compute_epsilon
from .config import DpConfig
from .events import PrivacyEvent, event_from_entry
from .ledger import RELEASE, Ledger, entry_kind
from .participation import capped_events


class BudgetExceededError(RuntimeError):
    """Recording this release would push cumulative epsilon above the budget."""


class PrivacyBudget:
    """The run's privacy history; epsilon is always recomputed from all events.

    Typical round: `event = config.round_event()`; `if budget.would_exceed(event):
    stop`; run the round; `budget.record_release(ledger, ...)` (fsync'd); release.
    """

    def __init__(self, config: DpConfig, history: Iterable[PrivacyEvent] = ()) -> None:
        self.config = config
        self._history: list[PrivacyEvent] = list(history)

    @classmethod
    def from_ledger(
        cls, config: DpConfig, entries: Ledger | Iterable[Mapping[str, Any]]
    ) -> PrivacyBudget:
        """Rebuild the accountant state after a restart, checking the run's invariants.

        Takes the Ledger itself or its entries; only release entries are composed
        (interruption and final records spend nothing).
        """
        budget = cls(config)
        releases = entries.releases if isinstance(entries, Ledger) else entries
        for entry in releases:
            if entry_kind(entry) != RELEASE:
                continue
            _check_entry_matches_config(entry, config)
            budget._history.append(event_from_entry(entry))
        return budget

    @property
    def history(self) -> tuple[PrivacyEvent, ...]:
        return tuple(self._history)

    @property
    def accountant(self) -> str:
        return self.config.accountant_name

    def spent(self) -> float:
        """Cumulative epsilon at the config's delta (0 before any release); under a
        participation cap, that of a client in the most releases the cap allows."""
        return self._epsilon(self._history)

    def epsilon_after(self, event: PrivacyEvent) -> float:
        return self._epsilon([*self._history, event])

    def _epsilon(self, events: list[PrivacyEvent]) -> float:
        capped = capped_events(events, self.config.max_participations)
        return compute_epsilon(capped, self.config.delta, self.accountant)

    def would_exceed(self, event: PrivacyEvent) -> bool:
        """Call BEFORE the round: would releasing `event` push epsilon over budget?"""
        return self.epsilon_after(event) > self.config.budget_epsilon

    def remaining(self) -> float:
        return max(0.0, self.config.budget_epsilon - self.spent())

    def record_release(
        self,
        ledger: Ledger,
        *,
        round_number: int,
        event: PrivacyEvent,
        clip_norm: float,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Write the round's ledger entry (durably) and only then count the event.

        Only public fields go to the ledger: per-round cohort counts reveal who took
        part, so the caller keeps them in its private annex, never in `extra`.

        Call after aggregation and BEFORE publishing the noised model: when this
        returns the entry is on disk, so a crash can never leave a release that the
        ledger does not show. Raises BudgetExceededError (nothing written) if the
        release would overspend.
        """
        epsilon = self.epsilon_after(event)
        if not epsilon <= self.config.budget_epsilon:
            raise BudgetExceededError(
                f"round {round_number}: epsilon would reach {epsilon:.6g} > budget "
                f"{self.config.budget_epsilon:.6g}; do not release"
            )
        fields = entry_fields(
            self.config,
            round_number=round_number,
            event=event,
            clip_norm=clip_norm,
            epsilon=epsilon,
        )
        if extra:
            fields.update({k: v for k, v in extra.items() if k not in fields})
        entry = ledger.record(fields)
        self._history.append(event)
        return entry


def entry_fields(
    config: DpConfig,
    *,
    round_number: int,
    event: PrivacyEvent,
    clip_norm: float,
    epsilon: float,
) -> dict[str, Any]:
    """The ledger fields of one release (the ledger adds timestamp and hashes)."""
    return {
        "round": round_number,
        "mechanism": config.mechanism,
        "noise_multiplier": event.noise_multiplier,
        "clip_norm": float(clip_norm),
        "sampling_rate": event.sampling_rate,
        "sampling": event.sampling,
        "neighbouring": event.neighbouring,
        "privacy_unit": config.privacy_unit,
        "population_size": event.population_size,
        "steps": event.steps,
        "delta": config.delta,
        "epsilon": epsilon,
        "accountant": config.accountant_name,
        "budget_epsilon": config.budget_epsilon,
    } | (
        # Asynchronous DP: epsilon composes only this many releases (verify does too).
        {"max_participations": config.max_participations}
        if config.max_participations is not None
        else {}
    )


def _check_entry_matches_config(entry: Mapping[str, Any], config: DpConfig) -> None:
    # A restart must not silently change the rules the earlier rounds were spent under.
    expected = {
        "mechanism": config.mechanism,
        "privacy_unit": config.privacy_unit,
        "sampling": config.sampling,
        "neighbouring": config.neighbouring,
        "accountant": config.accountant_name,
    }
    for field, value in expected.items():
        if entry.get(field) != value:
            raise ValueError(
                f"ledger round {entry.get('round')}: {field}={entry.get(field)!r} "
                f"but the config says {value!r}"
            )
    if entry.get("max_participations") != config.max_participations:
        raise ValueError(
            f"ledger round {entry.get('round')}: max_participations="
            f"{entry.get('max_participations')!r} but the config says "
            f"{config.max_participations!r}"
        )
    for field in ("delta", "budget_epsilon"):
        if not math.isclose(float(entry.get(field, math.nan)), getattr(config, field)):
            raise ValueError(
                f"ledger round {entry.get('round')}: {field}={entry.get(field)!r} "
                f"but the config says {getattr(config, field)!r}"
            )
