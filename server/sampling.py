"""Cohort sampling: fixed size without replacement, or Poisson with rate q.

The two schemes have different privacy amplification (and accountants), so
which one ran is part of every round's record. The generator is seeded from
the run seed so a run is reproducible; its state is checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class CohortSampler:
    num_clients: int
    scheme: str  # "fixed" | "poisson"
    per_round: int
    rate: float
    seed: int

    def __post_init__(self) -> None:
        if self.scheme not in ("fixed", "poisson"):
            raise ValueError(f"sampling = {self.scheme!r}: must be 'fixed' or 'poisson'")
        if self.scheme == "fixed" and not 1 <= self.per_round <= self.num_clients:
            raise ValueError(f"per_round = {self.per_round}: must be in [1, {self.num_clients}]")
        if self.scheme == "poisson" and not 0 < self.rate <= 1:
            raise ValueError(f"sample_rate = {self.rate}: must be in (0, 1]")
        self.rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x5A3]))

    @property
    def expected_size(self) -> float:
        return self.per_round if self.scheme == "fixed" else self.rate * self.num_clients

    def sample(self) -> list[int]:
        """The next cohort, as sorted client ids (possibly empty under Poisson)."""
        if self.scheme == "fixed":
            chosen = self.rng.choice(self.num_clients, size=self.per_round, replace=False)
        else:
            chosen = np.flatnonzero(self.rng.random(self.num_clients) < self.rate)
        return sorted(int(c) for c in chosen)

    def state(self) -> dict[str, Any]:
        return self.rng.bit_generator.state

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state
