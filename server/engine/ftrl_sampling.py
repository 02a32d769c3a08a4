"""DP-FTRL cohorts: fixed-size, drawn only among the clients the schema still allows.

Round r's cohort is `per_round` clients (fewer if fewer are eligible) chosen uniformly
among those with fewer than k participations whose last one was at least b rounds
ago. Every drawn client counts as a participation, whether or not its update arrives
(conservative: a device may have trained). The guarantee does not rest on these draws
being secret; they come from a generator keyed by the run's CSPRNG cohort key, so a
resume reproduces them. Why a cohort shrank (eligible < per_round) is left to the
operator's log: at b = N / per_round every client must take part exactly every b
rounds, and any unavailable client shrinks the cohorts.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from fedveil.privacy.dp.ftrl import ParticipationSchema

log = logging.getLogger("fedveil.privacy")


class SchemaCohortSampler:
    """The round engine's sampler interface (sampling.CohortDraws) under a schema."""

    source: ClassVar[str] = "csprng"  # keyed by the run's CSPRNG cohort key

    def __init__(
        self,
        num_clients: int,
        per_round: int,
        schema: ParticipationSchema,
        rounds: int,
        key: bytes,
    ) -> None:
        if not (1 <= per_round <= num_clients):
            raise ValueError(f"per_round = {per_round}: must be in [1, {num_clients}]")
        self.num_clients = num_clients
        self.per_round = per_round
        self.schema = schema
        self.rounds = rounds
        self.rng = np.random.Generator(np.random.PCG64(int.from_bytes(key, "big")))
        self.drawn = 0  # cohorts drawn so far: the next one is for round drawn + 1
        self.history: dict[int, list[int]] = {}

    @property
    def expected_size(self) -> float:
        return float(self.per_round)

    def eligible(self, round_index: int) -> list[int]:
        return [
            cid
            for cid in range(self.num_clients)
            if self.schema.allows(self.history.get(cid, []), round_index, self.rounds) is None
        ]

    def sample(self) -> list[int]:
        round_index = self.drawn + 1
        pool = self.eligible(round_index)
        size = min(self.per_round, len(pool))
        if size < self.per_round:
            log.warning(
                "DP-FTRL round %d: %d clients eligible under %s, cohort shrinks to %d < %d",
                round_index,
                len(pool),
                self.schema.describe(),
                size,
                self.per_round,
            )
        chosen = sorted(int(c) for c in self.rng.choice(pool, size=size, replace=False))
        for cid in chosen:
            self.history.setdefault(cid, []).append(round_index)
        self.drawn = round_index
        return chosen

    def state(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "drawn": self.drawn,
            "history": {str(cid): rounds for cid, rounds in self.history.items()},
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.drawn = int(state["drawn"])
        self.history = {
            int(cid): [int(r) for r in rounds] for cid, rounds in state["history"].items()
        }
