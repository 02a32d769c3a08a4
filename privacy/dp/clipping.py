"""Client-side L2 clipping of model updates."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .vectors import as_vector


def l2_norm(update: Any) -> float:
    """L2 norm computed in float64 so float32 rounding cannot hide an overshoot."""
    return float(np.linalg.norm(as_vector(update, np.float64)))


def clip_l2(update: Any, clip_norm: float) -> np.ndarray:
    """Scale `update` down to L2 norm <= `clip_norm` (unchanged if already inside).

    Returns a float32 vector. The factor is computed in float64 and, if float32
    rounding still lands a hair above C, shrunk by one ulp-sized step: the
    sensitivity bound the accountant relies on must hold exactly.
    """
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm={clip_norm!r} is invalid; allowed: a finite number > 0")
    vector = as_vector(update, np.float64)
    norm = float(np.linalg.norm(vector))
    if norm <= clip_norm:
        clipped = vector.astype(np.float32)
    else:
        clipped = (vector * (clip_norm / norm)).astype(np.float32)
    while float(np.linalg.norm(clipped.astype(np.float64))) > clip_norm:
        clipped = (clipped.astype(np.float64) * (1 - 1e-7)).astype(np.float32)
    return clipped
