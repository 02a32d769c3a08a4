"""Central DP (DP-FedAvg): the trusted server noises the aggregated sum."""

from __future__ import annotations

from typing import Any

import numpy as np

from .rng import resolve_generator
from .vectors import as_vector


def add_gaussian_noise(
    aggregate: Any,
    noise_multiplier: float,
    clip_norm: float,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Sum of clipped updates + N(0, (z*C)^2 I), as float32.

    Noise is drawn in float64 and added before the cast, so the float32 result is
    one rounding of the exact noised value. Pass no `rng` in production.
    """
    if not (noise_multiplier > 0 and clip_norm > 0):
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r}, clip_norm={clip_norm!r} are invalid; "
            "allowed: both > 0"
        )
    vector = as_vector(aggregate, np.float64)
    noise = resolve_generator(rng).normal(0.0, noise_multiplier * clip_norm, size=vector.shape)
    return (vector + noise).astype(np.float32)
