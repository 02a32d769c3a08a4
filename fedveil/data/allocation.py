"""Integer allocation helpers shared by the partitioners."""

from __future__ import annotations

import numpy as np

__all__ = ["apportion", "split_by_sizes"]


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Split ``total`` into non-negative ints proportional to ``weights`` (largest remainder).

    The result sums to exactly ``total``; ties go to the lower index, so it is
    deterministic. All-zero weights split evenly.
    """
    w = np.asarray(weights, dtype=np.float64)
    if total < 0 or w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"apportion: need total >= 0 and finite non-negative weights, got {total}")
    s = w.sum()
    quota = np.full(len(w), total / len(w)) if s <= 0 else total * (w / s)
    base = np.floor(quota).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        # stable sort on the negated remainder: largest remainders first, index breaks ties
        base[np.argsort(-(quota - base), kind="stable")[:short]] += 1
    return base


def split_by_sizes(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Consecutive chunks of ``indices`` with the given sizes (which must sum to its length)."""
    if int(np.sum(sizes)) != len(indices):
        raise ValueError(f"split_by_sizes: sizes sum to {int(np.sum(sizes))}, need {len(indices)}")
    return np.split(indices, np.cumsum(sizes)[:-1])
