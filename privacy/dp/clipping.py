"""L2 clipping of model updates: the one implementation, for clients and the server.

A DP sensitivity bound must hold for the values actually sent, which are float32:
every function here measures norms in float64 over the float32 values, so float32
rounding can neither hide an overshoot nor push a clipped update above C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .vectors import as_vector

# A clipped update is scaled to a hair under C, so that a float32 measurement of its
# norm (a device's policy check, torch's norm) stays under C too. The float64 bound is
# then verified, and the factor shrunk further if float32 rounding still crosses it.
_MARGIN = 2.0**-20
# First shrink step when float32 rounding lands a clipped vector above C; it doubles
# on every retry, so even denormals (whose rounding is coarse) reach the bound.
_FIRST_SHRINK = 2.0**-24


@dataclass(frozen=True)
class Clipped:
    """An update clipped to L2 norm <= C."""

    vector: np.ndarray  # float32; its float64 L2 norm is <= C
    norm: float  # the update's L2 norm before clipping (float64; inf if it overflows)
    changed: bool  # False: `vector` holds the update's own values (already within C)


def l2_norm(update: Any) -> float:
    """L2 norm computed in float64 so float32 rounding cannot hide an overshoot."""
    return float(np.linalg.norm(as_vector(update, np.float64)))


def check_clip_norm(clip_norm: float) -> None:
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm={clip_norm!r} is invalid; allowed: a finite number > 0")


def clip_update(update: Any, clip_norm: float) -> Clipped:
    """Scale `update` (numpy, torch or a sequence; finite values) down to L2 norm
    <= `clip_norm` as a float32 vector, leaving it unchanged if already inside.

    The factor is computed in float64 and aims a hair (2**-20 relative) under C; if
    float32 rounding still lands the result above C, the factor shrinks until it does
    not: the sensitivity bound the accountant relies on holds exactly, in float64, for
    the float32 values.
    """
    check_clip_norm(clip_norm)
    vector = as_vector(update, np.float64)  # raises on NaN or infinite values
    with np.errstate(over="ignore"):  # huge float64 values: handled below
        norm = float(np.linalg.norm(vector))
    if norm <= clip_norm:
        inside = vector.astype(np.float32)
        if _norm32(inside) <= clip_norm:  # casting a float64 input may round it above C
            return Clipped(inside, norm, changed=False)
        scale = 1.0
    elif math.isinf(norm):  # float64 overflow of huge values: scale through the maximum
        largest = float(np.max(np.abs(vector)))
        scale = clip_norm / largest / float(np.linalg.norm(vector / largest))
    else:
        scale = clip_norm / norm
    return Clipped(_scaled_within(vector, scale * (1 - _MARGIN), clip_norm), norm, changed=True)


def clip_l2(update: Any, clip_norm: float) -> np.ndarray:
    """`update` clipped to L2 norm <= `clip_norm`, as a float32 vector (see clip_update)."""
    return clip_update(update, clip_norm).vector


def check_l2_bound(update: Any, clip_norm: float) -> float:
    """The update's float64 L2 norm; ValueError if it exceeds `clip_norm`. For code that
    must never process an unclipped update (an encoder adding calibrated noise)."""
    check_clip_norm(clip_norm)
    norm = l2_norm(update)
    if norm > clip_norm:
        raise ValueError(
            f"update L2 norm = {norm!r} exceeds clip_norm = {clip_norm!r}; "
            "allowed: <= clip_norm (clip it first)"
        )
    return norm


def _norm32(vector: np.ndarray) -> float:
    return float(np.linalg.norm(vector.astype(np.float64)))


def _scaled_within(vector: np.ndarray, scale: float, clip_norm: float) -> np.ndarray:
    # Always scale the float64 original, never a rounded result: no compounding.
    clipped = (vector * scale).astype(np.float32)
    step = _FIRST_SHRINK
    while _norm32(clipped) > clip_norm:
        scale *= 1 - step
        step = min(2 * step, 0.5)
        clipped = (vector * scale).astype(np.float32)
    return clipped
