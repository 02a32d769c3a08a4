"""Privacy events: one (sampled) Gaussian release, possibly repeated `steps` times."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fedveil.protocol.dp_rules import (
    ADD_REMOVE,
    FIXED,
    NEIGHBOURING_RELATIONS,
    POISSON,
    SAMPLING_SCHEMES,
)


@dataclass(frozen=True)
class PrivacyEvent:
    """`steps` compositions of a sampled Gaussian mechanism.

    `noise_multiplier` is the noise standard deviation divided by the bound on ONE
    record's contribution (the clip norm C). Under replace-one two neighbouring
    outputs may differ by 2C; the accounting facade handles that factor, callers
    never halve z themselves. Under add/remove and zero-out they differ by C.

    For distributed Skellam, `noise_multiplier` is the Gaussian-equivalent z of the
    decoded sum (SkellamParams.noise_multiplier_for): the RDP curve alpha / (2 z^2)
    bounds the mechanism at every order, which is what the skellam_rdp accountant uses.
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int = 1
    sampling: str = POISSON
    neighbouring: str = ADD_REMOVE
    population_size: int | None = None  # required for fixed-size sampling

    def __post_init__(self) -> None:
        _require(
            math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0,
            "noise_multiplier",
            self.noise_multiplier,
            "a finite number > 0",
        )
        _require(0 < self.sampling_rate <= 1, "sampling_rate", self.sampling_rate, "(0, 1]")
        _require(
            isinstance(self.steps, int) and self.steps >= 1,
            "steps",
            self.steps,
            "an integer >= 1",
        )
        _require(self.sampling in SAMPLING_SCHEMES, "sampling", self.sampling, SAMPLING_SCHEMES)
        _require(
            self.neighbouring in NEIGHBOURING_RELATIONS,
            "neighbouring",
            self.neighbouring,
            NEIGHBOURING_RELATIONS,
        )
        if self.sampling == FIXED:
            _require(
                isinstance(self.population_size, int) and self.population_size >= 1,
                "population_size",
                self.population_size,
                "an integer >= 1 (required for fixed-size sampling)",
            )
            sample = self.sampling_rate * self.population_size
            _require(
                abs(sample - round(sample)) < 1e-6 and round(sample) >= 1,
                "sampling_rate",
                self.sampling_rate,
                f"k/{self.population_size} for an integer sample size k >= 1",
            )

    @property
    def sample_size(self) -> int:
        """Fixed sample size (fixed-size sampling) or expected one (Poisson)."""
        if self.population_size is None:
            raise ValueError("sample_size needs population_size")
        return round(self.sampling_rate * self.population_size)

    def group_key(self) -> tuple[float, float, str, str, int | None]:
        """Events with equal keys compose into one event with the summed step count."""
        return (
            self.noise_multiplier,
            self.sampling_rate,
            self.sampling,
            self.neighbouring,
            self.population_size,
        )


def group_events(events: Iterable[PrivacyEvent]) -> tuple[PrivacyEvent, ...]:
    """Merge constant-parameter events into one event each (composition is commutative).

    Accountants then compose `count=T` in one FFT/closed form instead of T times,
    which is both faster and numerically tighter than event-by-event composition.
    """
    steps: dict[tuple[float, float, str, str, int | None], int] = {}
    first: dict[tuple[float, float, str, str, int | None], PrivacyEvent] = {}
    for event in events:
        key = event.group_key()
        steps[key] = steps.get(key, 0) + event.steps
        first.setdefault(key, event)
    grouped = (replace(first[key], steps=count) for key, count in steps.items())
    return tuple(sorted(grouped, key=lambda e: (e.group_key()[:2], e.steps)))


def _require(ok: bool, field: str, value: object, allowed: object) -> None:
    if not ok:
        raise ValueError(f"PrivacyEvent.{field}={value!r} is invalid; allowed: {allowed}")


def event_from_entry(entry: Mapping[str, Any]) -> PrivacyEvent:
    """The privacy event a ledger entry records (what the accountant composes)."""
    return PrivacyEvent(
        noise_multiplier=float(entry["noise_multiplier"]),
        sampling_rate=float(entry["sampling_rate"]),
        steps=int(entry.get("steps", 1)),
        sampling=entry["sampling"],
        neighbouring=entry["neighbouring"],
        population_size=entry.get("population_size"),
    )
