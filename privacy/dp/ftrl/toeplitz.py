"""Lower-triangular Toeplitz algebra: C[i, j] = c[i - j] for i >= j, 0 above.

Banded and BLT encoders are of this form, and so are their inverses and decoders
B = A C^-1 (A the prefix-sum matrix), which keeps every figure O(T) or O(T^2) in
coefficients instead of O(T^3) in matrices.
"""

from __future__ import annotations

import numpy as np


def toeplitz_matrix(coefficients: np.ndarray, rounds: int) -> np.ndarray:
    """The T x T lower-triangular Toeplitz matrix of `coefficients` (padded with zeros)."""
    c = np.zeros(rounds)
    n = min(rounds, len(coefficients))
    c[:n] = coefficients[:n]
    index = np.arange(rounds)
    lag = index[:, None] - index[None, :]
    return np.where(lag >= 0, c[np.clip(lag, 0, rounds - 1)], 0.0)


def inverse_coefficients(coefficients: np.ndarray, rounds: int) -> np.ndarray:
    """r with C(r) = C(c)^-1: sum_i c_i r_(j-i) = [j == 0], for j < T."""
    c = np.zeros(rounds)
    n = min(rounds, len(coefficients))
    c[:n] = coefficients[:n]
    if not (abs(c[0]) > 0):
        raise ValueError(f"Toeplitz c_0={c[0]!r} is invalid; allowed: nonzero (C invertible)")
    r = np.zeros(rounds)
    r[0] = 1.0 / c[0]
    width = int(np.max(np.nonzero(c)[0])) + 1  # the band: only the last width-1 terms count
    for j in range(1, rounds):
        lo = max(0, j - width + 1)
        # sum_{i=1..j} c_i r_(j-i), over the band only
        r[j] = -np.dot(c[1 : j - lo + 1], r[lo:j][::-1]) / c[0]
    return r


def decoder_coefficients(coefficients: np.ndarray, rounds: int) -> np.ndarray:
    """s with C(s) = A C(c)^-1: the prefix sums of the inverse's coefficients."""
    return np.cumsum(inverse_coefficients(coefficients, rounds))
