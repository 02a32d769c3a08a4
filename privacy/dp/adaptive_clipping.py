"""Adaptive clipping toward a target quantile of update norms (Andrew et al. 2021).

Clients report b = 1 if their update norm is <= C (unclipped); the server only sees
the (securely aggregated) count plus Gaussian noise of std sigma_b, and moves C
geometrically:  C <- C * exp(-eta * (b_bar - gamma)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .clipping import l2_norm
from .rng import resolve_generator


def clip_indicator(update: Any, clip_norm: float) -> int:
    """Client side: 1 if the UNCLIPPED update fits inside `clip_norm`, else 0."""
    return int(l2_norm(update) <= clip_norm)


def noised_count(
    count: float, count_stddev: float, rng: np.random.Generator | None = None
) -> float:
    """Server side (central DP): the aggregated indicator count plus N(0, sigma_b^2)."""
    if not count_stddev > 0:
        raise ValueError(f"count_stddev={count_stddev!r} is invalid; allowed: > 0")
    return float(count + resolve_generator(rng).normal(0.0, count_stddev))


def next_clip_norm(
    clip_norm: float,
    noised_unclipped_count: float,
    expected_cohort: float,
    target_quantile: float = 0.5,
    learning_rate: float = 0.2,
) -> float:
    """Geometric update of C from the noised count of unclipped clients.

    Divides by the EXPECTED cohort size, not the number that reported: the true
    count of participants is not privatised, so it must not drive the estimate.
    """
    if not expected_cohort > 0:
        raise ValueError(f"expected_cohort={expected_cohort!r} is invalid; allowed: > 0")
    unclipped_fraction = noised_unclipped_count / expected_cohort
    return float(clip_norm * math.exp(-learning_rate * (unclipped_fraction - target_quantile)))


def update_noise_multiplier(total_noise_multiplier: float, count_stddev: float) -> float:
    """Noise multiplier for the update sum so that sum + count together cost `total`.

    Both releases are Gaussian on the same sampled clients, so they compose into one
    Gaussian with 1/z^2 = 1/z_update^2 + 1/sigma_b^2 (count sensitivity 1; Andrew et
    al. centre the bit to get sensitivity 1/2, we keep the conservative 1 because the
    number of participants is not assumed public).
    """
    if not 0 < total_noise_multiplier < count_stddev:
        raise ValueError(
            f"total_noise_multiplier={total_noise_multiplier!r} is invalid; allowed: "
            f"(0, count_stddev={count_stddev!r})"
        )
    return (total_noise_multiplier**-2 - count_stddev**-2) ** -0.5


def total_noise_multiplier(update_noise_multiplier: float, count_stddev: float) -> float:
    """Inverse of `update_noise_multiplier`: the accounting z of both releases together."""
    return (update_noise_multiplier**-2 + count_stddev**-2) ** -0.5
