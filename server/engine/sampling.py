"""Cohort sampling: fixed size without replacement, or Poisson with rate q.

The two schemes have different privacy amplification (and accountants), so
which one ran is part of every round's record. Without DP the generator is
seeded from the run seed so a run is reproducible; its state is checkpointed.
Under DP cohorts come from a secret key instead (SecretCohortSampler).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


class CohortDraws(Protocol):
    """What the round engine draws each round's cohort from and checkpoints: this
    module's two samplers, or the one a release mechanism constrains cohorts to
    (`ReleaseMechanism.cohort_sampler`, e.g. DP-FTRL's participation schema)."""

    # Where the draws come from, as the run's summary states it: "seed" (the public
    # run seed: anyone can recompute the cohorts) or "csprng" (the run's secret key).
    source: ClassVar[str]

    @property
    def expected_size(self) -> float: ...

    def sample(self) -> list[int]:
        """The next cohort, as sorted client ids."""
        ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


@dataclass
class CohortSampler:
    source: ClassVar[str] = "seed"

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
            # Chunk by chunk: the generator's stream is the same as one draw of
            # num_clients uniforms, with one chunk in memory at a time.
            chosen = np.concatenate(
                [
                    start
                    + np.flatnonzero(
                        self.rng.random(min(CHUNK, self.num_clients - start)) < self.rate
                    )
                    for start in range(0, self.num_clients, CHUNK)
                ]
            )
        return sorted(int(c) for c in chosen)

    def state(self) -> dict[str, Any]:
        return self.rng.bit_generator.state

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state


COMMIT_LABEL = b"fedveil-cohort-key/1"
# Uniforms drawn per step of a secret draw: 512 KiB of float64 however large the population.
CHUNK = 1 << 16


def cohort_commitment(key: bytes) -> str:
    """SHA-256 over a label and the cohort key (hex): opens the run's ledger."""
    return hashlib.sha256(COMMIT_LABEL + key).hexdigest()


def committed_graph_seed(key: bytes, round_num: int) -> bytes:
    """The neighbour-graph seed of round `round_num`: HMAC-SHA256 of the committed key, so
    the server cannot pick a graph per round after seeing who is in the cohort."""
    return hmac.new(key, b"graph" + round_num.to_bytes(8, "big"), hashlib.sha256).digest()


class SecretCohortSampler:
    """Cohorts for DP runs: drawn from a secret 256-bit key (OS CSPRNG), never the seed.

    Amplification by sampling holds only against someone who cannot recompute the
    cohorts, and the run seed is public (config.toml, summary.json). Round r's cohort
    is a function of (key, r) through AES-256-CTR, a cryptographic PRG: resuming needs
    only the key and the draw count, and an auditor given the key (whose SHA-256
    commitment opens the ledger) can recompute every cohort afterwards.
    """

    source: ClassVar[str] = "csprng"

    def __init__(
        self, num_clients: int, scheme: str, per_round: int, rate: float, key: bytes
    ) -> None:
        CohortSampler(num_clients, scheme, per_round, rate, 0)  # same checks, same messages
        if len(key) != 32:
            raise ValueError("cohort key must be 32 bytes")
        self.num_clients, self.scheme, self.per_round, self.rate = (
            num_clients,
            scheme,
            per_round,
            rate,
        )
        self._key = key
        self.draws = 0

    @property
    def expected_size(self) -> float:
        return self.per_round if self.scheme == "fixed" else self.rate * self.num_clients

    @property
    def commitment(self) -> str:
        """SHA-256 of the label and the key: published, binds the operator to the key."""
        return cohort_commitment(self._key)

    def graph_seed(self, round_num: int) -> bytes:
        """Round r's secure-aggregation graph seed, fixed by the committed key."""
        return committed_graph_seed(self._key, round_num)

    def uniforms(self, label: bytes, index: int, count: int) -> np.ndarray:
        """`count` independent uniforms in [0, 1) from (key, label, index)."""
        return np.concatenate([u for _, u in self.uniform_chunks(label, index, count)])

    def uniform_chunks(
        self, label: bytes, index: int, count: int
    ) -> Iterator[tuple[int, np.ndarray]]:
        """The same uniforms as `uniforms`, as (offset, chunk) pairs of at most CHUNK:
        the AES-CTR stream is cut, not changed, so a million clients' draw holds
        one chunk at a time."""
        nonce = hashlib.sha256(label + index.to_bytes(8, "big")).digest()[:16]
        stream = Cipher(algorithms.AES(self._key), modes.CTR(nonce)).encryptor()
        for start in range(0, count, CHUNK):
            size = min(CHUNK, count - start)
            words = np.frombuffer(stream.update(bytes(8 * size)), dtype="<u8")
            yield start, (words >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def sample(self) -> list[int]:
        self.draws += 1
        return self.cohort(self.draws)

    def cohort(self, draw: int) -> list[int]:
        """The `draw`-th cohort (round r's cohort is draw r): what an auditor recomputes."""
        if self.scheme == "fixed":
            # The per_round clients with the smallest uniforms: a uniform random subset.
            return self.choice(b"cohort", draw, self.per_round)
        chosen = [
            start + np.flatnonzero(u < self.rate)
            for start, u in self.uniform_chunks(b"cohort", draw, self.num_clients)
        ]
        return sorted(int(c) for c in np.concatenate(chosen))

    def choice(self, label: bytes, index: int, k: int) -> list[int]:
        """The k clients with the smallest uniforms of (label, index): k distinct clients,
        a uniform random subset. Kept as a running k smallest over the stream's chunks
        (memory O(k + CHUNK), not O(num_clients)); the same set as one argpartition
        over all the uniforms."""
        if not 1 <= k <= self.num_clients:
            raise ValueError(f"k = {k}: must be in [1, {self.num_clients}]")
        best_u = np.empty(0, dtype=np.float64)
        best_id = np.empty(0, dtype=np.int64)
        for start, u in self.uniform_chunks(label, index, self.num_clients):
            ids = np.arange(start, start + u.size, dtype=np.int64)
            if u.size > k:
                keep = np.argpartition(u, k - 1)[:k]
                u, ids = u[keep], ids[keep]
            best_u, best_id = np.concatenate([best_u, u]), np.concatenate([best_id, ids])
            if best_u.size > k:
                keep = np.argpartition(best_u, k - 1)[:k]
                best_u, best_id = best_u[keep], best_id[keep]
        return sorted(int(c) for c in best_id)

    def state(self) -> dict[str, Any]:
        return {"draws": self.draws}

    def restore(self, state: dict[str, Any]) -> None:
        self.draws = int(state["draws"])
