"""Cohorts of a million clients: drawn in bounded memory, the same cohorts as before.

The secret sampler's cohort is the per_round smallest of n keyed uniforms (or those under
q); an auditor recomputes it from the committed key, so streaming the draw must not
change it. The dense draw (n uniforms at once, then one argpartition) is the reference.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fedveil.server.engine.sampling import CHUNK, CohortSampler, SecretCohortSampler

KEY = bytes(range(32))
MILLION = 1_000_000


def dense_cohort(s: SecretCohortSampler, draw: int) -> list[int]:
    u = s.uniforms(b"cohort", draw, s.num_clients)
    if s.scheme == "fixed":
        return sorted(int(c) for c in np.argpartition(u, s.per_round - 1)[: s.per_round])
    return sorted(int(c) for c in np.flatnonzero(u < s.rate))


@pytest.mark.parametrize(
    ("n", "scheme", "k", "q"),
    [
        (10, "fixed", 10, 0.0),
        (CHUNK - 1, "fixed", 7, 0.0),
        (3 * CHUNK + 5, "fixed", 500, 0.0),
        (3 * CHUNK + 5, "poisson", 0, 0.01),
        (2 * CHUNK, "fixed", CHUNK + 3, 0.0),
    ],
)
def test_streamed_cohort_is_the_dense_draw(n: int, scheme: str, k: int, q: float) -> None:
    s = SecretCohortSampler(n, scheme, k, q, KEY)
    for draw in (1, 2):
        assert s.cohort(draw) == dense_cohort(s, draw)


def peak_bytes(fn) -> int:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("scheme", ["fixed", "poisson"])
def test_secret_cohort_of_a_million_holds_no_dense_draw(scheme: str) -> None:
    # A dense draw holds 8 MB of uniforms (and as much again in AES words) per round.
    s = SecretCohortSampler(MILLION, scheme, 100, 1e-4, KEY)
    peak = peak_bytes(lambda: s.cohort(1))
    assert peak < 6 * 8 * CHUNK, f"peak {peak} bytes for one cohort of {MILLION:,} clients"


def test_seeded_poisson_cohort_of_a_million_holds_no_dense_draw() -> None:
    s = CohortSampler(MILLION, "poisson", 0, 1e-4, seed=1)
    reference = CohortSampler(MILLION, "poisson", 0, 1e-4, seed=1)
    expected = sorted(int(c) for c in np.flatnonzero(reference.rng.random(MILLION) < 1e-4))
    chosen: list[int] = []
    peak = peak_bytes(lambda: chosen.extend(s.sample()))
    assert chosen == expected  # the same stream, cut into chunks
    assert peak < 6 * 8 * CHUNK, f"peak {peak} bytes for one cohort of {MILLION:,} clients"
