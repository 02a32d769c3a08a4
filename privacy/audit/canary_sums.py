"""The idealised simulation of a canary audit: the mechanism on the canaries' statistics
alone, cheap enough to measure an audit design's power over many seeds.

Each of m Dirac canaries (one coordinate of the update each, at the clip norm: units of
C here) is inserted with probability 1/2. In each of T rounds an inserted canary is
sampled with probability q (Poisson, like every client) and adds 1 to its coordinate of
the sum; the release adds Gaussian noise of standard deviation `noise_scale` * z to
every coordinate. The statistic is the sum over rounds of each canary's coordinate (the
harness's projection). The users' updates are left out (they only add to the noise), so
this is the most an audit of these canaries could see: `noise_scale` = 1 is the
mechanism the ledger claims, 1/4 and 0 are broken ones.
"""

from __future__ import annotations

import numpy as np


def simulate_canary_sums(
    rng: np.random.Generator,
    canaries: int,
    sampling_rate: float,
    rounds: int,
    noise_multiplier: float,
    noise_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(inserted, statistic) for one simulated run."""
    if canaries < 1 or rounds < 1:
        raise ValueError(f"canaries = {canaries}, rounds = {rounds}: must be >= 1")
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate = {sampling_rate}: must be in (0, 1]")
    if not (noise_multiplier >= 0 and noise_scale >= 0):
        raise ValueError(f"noise {noise_multiplier} x {noise_scale}: must be >= 0")
    inserted = rng.random(canaries) < 0.5
    sampled = rng.binomial(rounds, sampling_rate, size=canaries)
    # The sum of T independent N(0, (s z)^2) draws is one N(0, T (s z)^2) draw.
    noise = rng.standard_normal(canaries) * (noise_scale * noise_multiplier * np.sqrt(rounds))
    return inserted, inserted * sampled + noise
