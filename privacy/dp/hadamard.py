"""Randomized Hadamard rotation: flattens a vector's mass across coordinates.

After x -> H D x / sqrt(d) (D a random +-1 diagonal shared by all clients of a
round) every coordinate is sub-Gaussian with variance ||x||^2 / d, so modular
clipping sized on that variance rarely wraps. The rotation is orthonormal and its
seed is public: it protects utility, not privacy.
"""

from __future__ import annotations

import numpy as np


def padded_dimension(dim: int) -> int:
    """The next power of two >= dim (the Walsh-Hadamard transform needs one)."""
    if dim < 1:
        raise ValueError(f"dim={dim!r} is invalid; allowed: an integer >= 1")
    return 1 << (dim - 1).bit_length()


def walsh_hadamard(vector: np.ndarray) -> np.ndarray:
    """Orthonormal fast Walsh-Hadamard transform (its own inverse), O(d log d)."""
    size = vector.shape[0]
    if size & (size - 1):
        raise ValueError(f"length {size} is not a power of two")
    out = np.array(vector, dtype=np.float64)
    half = 1
    while half < size:
        pairs = out.reshape(-1, 2, half)
        out = np.stack((pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]), axis=1)
        half *= 2
    return out.reshape(size) / np.sqrt(size)


def _signs(rotation_seed: int, size: int) -> np.ndarray:
    # Public randomness: every client and the server derive the same diagonal.
    return np.random.default_rng(rotation_seed).choice(np.array([-1.0, 1.0]), size=size)


def rotate(vector: np.ndarray, rotation_seed: int) -> np.ndarray:
    """Pad to a power of two and apply H D / sqrt(d)."""
    size = padded_dimension(vector.shape[0])
    padded = np.zeros(size, dtype=np.float64)
    padded[: vector.shape[0]] = vector
    return walsh_hadamard(padded * _signs(rotation_seed, size))


def unrotate(rotated: np.ndarray, rotation_seed: int, dim: int) -> np.ndarray:
    """Inverse of `rotate`, truncated back to the original dimension."""
    size = rotated.shape[0]
    return (walsh_hadamard(rotated) * _signs(rotation_seed, size))[:dim]
