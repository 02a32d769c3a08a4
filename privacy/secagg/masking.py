"""Adding and removing PRG masks in Z_(2^b) with numpy, no per-element Python work.

Vectors are uint32 (b ≤ 32) or uint64 (b ≤ 62). numpy's unsigned arithmetic wraps modulo
2^32 / 2^64, and 2^b divides both, so we add whole keystream words and reduce with one AND at
the end. Keystreams are written into one reusable scratch buffer.
"""

from __future__ import annotations

import numpy as np

from .crypto import keystream_into


class MaskApplier:
    """Accumulates ± AES-CTR masks into a vector in place."""

    def __init__(self, dimension: int, dtype: type[np.unsignedinteger], modulus_bits: int) -> None:
        self._scratch = np.empty(dimension, dtype=dtype)
        self._mask = dtype((1 << modulus_bits) - 1)
        self._full_width = modulus_bits == np.dtype(dtype).itemsize * 8

    def fresh(self, key: bytes) -> np.ndarray:
        """A new vector holding the keystream of `key` (saves a copy for the first mask)."""
        out = np.empty_like(self._scratch)
        keystream_into(key, out)
        return out

    def add(self, target: np.ndarray, key: bytes) -> None:
        keystream_into(key, self._scratch)
        np.add(target, self._scratch, out=target)

    def subtract(self, target: np.ndarray, key: bytes) -> None:
        keystream_into(key, self._scratch)
        np.subtract(target, self._scratch, out=target)

    def reduce(self, target: np.ndarray) -> None:
        """Bring every coordinate into [0, 2^b)."""
        if not self._full_width:
            np.bitwise_and(target, self._mask, out=target)
