"""Dirac canaries: each canary's update is the clip norm on one coordinate of the model.

Distinct coordinates make the canaries exactly separable (no canary leaks into another's
statistic, however many there are), so a model of dimension d supports at most d of
them; and a canary costs one integer, not a d-vector (the random unit directions of
Andrew et al. held m x d floats: about 1.3 GB for 2,000 canaries on the CNN). The
coordinates come from a seed the auditor keeps secret; the seed itself comes from the
OS CSPRNG (see `new_secret_seed`).

The statistic, fixed before the run: the sum over rounds of each canary's projection of
the released update, i.e. its coordinate of the final model minus the initial one.
"""

from __future__ import annotations

import secrets

import numpy as np

HELD_OUT = -1  # a zero-out canary's coordinate: it takes part with a zero update


def new_secret_seed() -> int:
    """A 128-bit seed from the OS CSPRNG: the auditor's secret, never written to logs."""
    return secrets.randbits(128)


def supported_canaries(dim: int) -> int:
    """How many Dirac canaries a model of `dim` parameters supports: one coordinate each."""
    return dim


def dirac_coordinates(seed: int, count: int, dim: int) -> np.ndarray:
    """`count` distinct coordinates of R^dim, a function of `seed` only."""
    if count < 1:
        raise ValueError(f"canary count = {count}: must be >= 1")
    if dim < 1:
        raise ValueError(f"model dimension = {dim}: must be >= 1")
    if count > supported_canaries(dim):
        raise ValueError(
            f"canary count = {count}: a model of {dim} parameters supports at most "
            f"{supported_canaries(dim)} Dirac canaries (one coordinate each)"
        )
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    return rng.choice(dim, size=count, replace=False).astype(np.int64)


def projection_sums(coordinates: np.ndarray, initial: np.ndarray, final: np.ndarray) -> np.ndarray:
    """Each canary's statistic: the sum over rounds of the released updates' projections
    on its coordinate, which telescopes to final - initial there."""
    coordinates = np.asarray(coordinates, np.int64)
    return np.asarray(final, np.float64)[coordinates] - np.asarray(initial, np.float64)[coordinates]
