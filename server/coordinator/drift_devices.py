"""The drift evaluations' epsilon per enrolled device, composed across every version.

The budget of drift_budget.py is per watched version, but the same devices answer the
evaluations of every version, and registering the same model again starts a fresh
version budget. So each DP evaluation's charge also names the devices it could ask: the
enrolled, unrevoked client ids when it was reserved (`devices`), or None where the
coordinator enrols no devices (every device that may connect could be asked: the whole
population). A device's epsilon is the composition (privacy/dp/evaluation.composed_epsilon,
at drift.delta) of the counted charges of every version that could ask it; an evaluation
is refused, naming drift.device_budget, when it would take the most-charged device that
it could ask past that cap.

Which devices could be asked, not which answered: the refusal and the published figure
then depend on enrolment alone, never on who was sampled or who replied (those stay in
the evaluation run's private annex). GET /drift and the dashboard show the most-charged
device's epsilon and how many evaluations compose into it, never a device id or a count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedveil.config.service_settings import DriftSection
from fedveil.privacy.dp.evaluation import EvaluationPlan, composed_epsilon, evaluation_event
from fedveil.server.coordinator.clients import ClientRegistry
from fedveil.server.coordinator.drift_budget import COUNTED

# Where a charge names no device list: every device that may connect could be asked.
EVERY_DEVICE = None


@dataclass(frozen=True)
class DeviceSpend:
    """The most-charged device's composed epsilon and the evaluations it composes."""

    epsilon: float
    evaluations: int

    def to_dict(self, budget: float) -> dict[str, Any]:
        return {
            "per": "enrolled device, across every version",
            "budget": budget,
            "epsilon_spent_max": self.epsilon,
            "budget_left": max(0.0, budget - self.epsilon),
            "evaluations_max": self.evaluations,
        }


def device_cap(settings: DriftSection) -> float:
    """drift.device_budget, 0 resolved: the per-version budget (a device then spends no
    more across all versions than one version's evaluations may)."""
    return settings.device_budget or settings.budget


def enrolled_devices(state_dir: Path) -> list[int] | None:
    """The enrolled, unrevoked client ids; None when the coordinator enrols none (without
    SuperNode authentication any device may connect)."""
    ids = sorted(
        cid for cid, r in ClientRegistry(state_dir).all().items() if not r.get("revoked_at")
    )
    return ids or EVERY_DEVICE


def counted_charges(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every version's charges that count (reserved or kept), in one list."""
    charges: dict[str, list[dict[str, Any]]] = state.get("charges") or {}
    return [c for per in charges.values() for c in per if c.get("status") in COUNTED]


def most_charged_device(
    charges: Iterable[dict[str, Any]],
    delta: float,
    *,
    plus: EvaluationPlan | None = None,
    asked: list[int] | None = EVERY_DEVICE,
) -> DeviceSpend:
    """The largest composed epsilon of any device, with one more evaluation `plus` that
    could ask the devices `asked` (None: every device).

    Devices with the same set of charges share one composition, so the work grows with
    the number of distinct enrolment histories, not with the number of devices.
    """
    charges = list(charges)
    lists = [None if c.get("devices") is EVERY_DEVICE else set(c["devices"]) for c in charges]
    named: set[int] = set().union(*(s for s in lists if s is not None))
    asked_set = None if asked is EVERY_DEVICE else set(asked)
    groups: dict[tuple[int, ...], bool] = {}  # charges -> whether `plus` could ask them

    def add(key: tuple[int, ...], in_next: bool) -> None:
        groups[key] = groups.get(key, False) or (plus is not None and in_next)

    for device in named:
        key = tuple(i for i, s in enumerate(lists) if s is None or device in s)
        add(key, asked_set is None or device in asked_set)
    # A device no charge names (enrolled since, or any device where none are enrolled)
    # carries only the population-wide charges; the next evaluation may ask one.
    population = tuple(i for i, s in enumerate(lists) if s is None)
    add(population, asked_set is None or bool(asked_set - named))
    worst = DeviceSpend(0.0, 0)
    for key, in_next in groups.items():
        events = [evaluation_event(float(charges[i]["noise_multiplier"])) for i in key]
        if in_next and plus is not None:
            events.append(plus.event())
        spend = DeviceSpend(composed_epsilon(events, delta) if events else 0.0, len(events))
        if spend.epsilon > worst.epsilon:
            worst = spend
    return worst
