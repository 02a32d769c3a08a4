"""Participation schemas: how often one client may take part in the T planned rounds.

`single`: at most once. `min_separation = b, max_participations = k`: at most k times,
any two participations at least b rounds apart (rounds i < j with j - i >= b). The
sensitivity of every factorisation is computed under one of these; the server's
cohort sampler and the devices enforce it. Every check fails closed: NaN, infinity,
floats for integers and missing fields are refused with the field and the limit.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SINGLE = "single"


@dataclass(frozen=True)
class ParticipationSchema:
    """`min_separation` b >= 1 and `max_participations` k >= 1; single is (b = T, k = 1)."""

    min_separation: int | None = None  # None: single participation
    max_participations: int = 1

    def __post_init__(self) -> None:
        if self.min_separation is not None:
            _require_int(self.min_separation, "min_separation", 1)
        _require_int(self.max_participations, "max_participations", 1)
        if self.min_separation is None and self.max_participations != 1:
            raise ValueError(
                f"dp.ftrl.participation.max_participations={self.max_participations!r} "
                "needs min_separation (single participation is at most 1)"
            )

    @property
    def single(self) -> bool:
        return self.min_separation is None

    def separation(self, rounds: int) -> int:
        """b, with single participation as b = T (nobody fits twice)."""
        return rounds if self.min_separation is None else self.min_separation

    def effective_participations(self, rounds: int) -> int:
        """k capped by what fits in `rounds` rounds at separation b: min(k, ceil(T / b))."""
        if self.single:
            return 1
        return min(self.max_participations, math.ceil(rounds / self.separation(rounds)))

    def allows(self, history: list[int], round_index: int, rounds: int) -> str | None:
        """Why a participation at `round_index` (1-based) after `history` breaks the
        schema (None: it does not)."""
        if len(history) >= self.max_participations:
            return (
                f"{len(history)} participations already, max_participations = "
                f"{self.max_participations} ({self.describe()})"
            )
        if history and not (round_index - max(history) >= self.separation(rounds)):
            return (
                f"round {round_index} is {round_index - max(history)} rounds after round "
                f"{max(history)}, min_separation = {self.separation(rounds)} ({self.describe()})"
            )
        return None

    def describe(self) -> str:
        if self.single:
            return "participation = 'single'"
        return (
            f"participation = {{min_separation = {self.min_separation}, "
            f"max_participations = {self.max_participations}}}"
        )

    def to_dict(self) -> dict[str, Any] | str:
        if self.single:
            return SINGLE
        return {
            "min_separation": self.min_separation,
            "max_participations": self.max_participations,
        }

    @classmethod
    def from_config(cls, value: object) -> ParticipationSchema:
        """'single' or {min_separation = b, max_participations = k}; anything else refused."""
        if value == SINGLE:
            return cls()
        if not isinstance(value, Mapping):
            raise ValueError(
                f"dp.ftrl.participation={value!r} is invalid; allowed: 'single' or "
                "{min_separation = b, max_participations = k}"
            )
        unknown = sorted(set(value) - {"min_separation", "max_participations"})
        if unknown:
            raise ValueError(
                f"dp.ftrl.participation has unknown fields {unknown}; allowed: "
                "min_separation, max_participations"
            )
        for name in ("min_separation", "max_participations"):
            if name not in value:
                raise ValueError(f"dp.ftrl.participation.{name} is missing; allowed: integer >= 1")
        return cls(
            min_separation=value["min_separation"], max_participations=value["max_participations"]
        )


def _require_int(value: object, name: str, floor: int) -> None:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or not (value >= floor):  # type: ignore[operator]
        raise ValueError(
            f"dp.ftrl.participation.{name}={value!r} is invalid; allowed: an integer >= {floor}"
        )
