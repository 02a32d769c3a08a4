"""Canary directions and their scores against released model deltas.

A canary's update is a fixed random unit direction (Andrew et al., ICLR 2024, Sec. 3):
in high dimension independent random directions are nearly orthogonal to each other and
to the users' updates, so the cosine between a released delta and a canary measures how
much of that canary the release carries. The directions come from a seed the auditor
keeps secret; the seed itself comes from the OS CSPRNG (see `new_secret_seed`).
"""

from __future__ import annotations

import secrets

import numpy as np


def new_secret_seed() -> int:
    """A 128-bit seed from the OS CSPRNG: the auditor's secret, never written to logs."""
    return secrets.randbits(128)


def canary_directions(seed: int, count: int, dim: int) -> np.ndarray:
    """`count` independent unit vectors in R^dim (rows), a function of `seed` only."""
    if count < 1:
        raise ValueError(f"canary count = {count}: must be >= 1")
    if dim < 1:
        raise ValueError(f"model dimension = {dim}: must be >= 1")
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    gauss = rng.standard_normal((count, dim))
    gauss /= np.linalg.norm(gauss, axis=1, keepdims=True)  # in place: no second copy
    return gauss


def cosine_scores(directions: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """cos(delta, c_i) for each canary row c_i (unit rows); 0 for a zero delta."""
    norm = float(np.linalg.norm(delta))
    if norm == 0.0:
        return np.zeros(directions.shape[0])
    return directions @ np.asarray(delta, dtype=np.float64) / norm


def max_round_scores(directions: np.ndarray, deltas: list[np.ndarray]) -> np.ndarray:
    """The all-rounds statistic: for each canary the largest cosine with any round's
    released delta (Andrew et al., ICLR 2024, "all iterates" variant: the adversary who
    sees every round's model takes the max over rounds)."""
    if not deltas:
        raise ValueError("no released rounds to score")
    return np.max(np.stack([cosine_scores(directions, d) for d in deltas]), axis=0)
