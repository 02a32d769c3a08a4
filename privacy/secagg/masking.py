"""Adding and removing PRG masks in Z_(2^b) with numpy, no per-element Python work.

Vectors are uint32 (b ≤ 32) or uint64 (b ≤ 62). numpy's unsigned arithmetic wraps modulo
2^32 / 2^64, and 2^b divides both, so we add whole keystream words and reduce with one AND at
the end. Keystreams are written into one reusable scratch buffer, a whole stream per call.
"""

from __future__ import annotations

import threading

import numpy as np

from .crypto import KeystreamBuffer

# Scratch buffers up to this size are kept per thread and reused by every round: a fresh
# buffer can cost a page fault per 4 KiB on first touch. Each fill is consumed at once, so
# appliers of the same thread can share one.
_CACHED_SCRATCH_BYTES = 16 << 20
_local = threading.local()


def _scratch(dimension: int, dtype: type[np.unsignedinteger]) -> KeystreamBuffer:
    if dimension * np.dtype(dtype).itemsize > _CACHED_SCRATCH_BYTES:
        return KeystreamBuffer(dimension, dtype)
    key = (dimension, np.dtype(dtype).str)
    cached: tuple[tuple[int, str], KeystreamBuffer] | None = getattr(_local, "scratch", None)
    if cached is None or cached[0] != key:
        cached = _local.scratch = (key, KeystreamBuffer(dimension, dtype))
    return cached[1]


class MaskApplier:
    """Accumulates ± AES-CTR masks into a vector in place."""

    def __init__(self, dimension: int, dtype: type[np.unsignedinteger], modulus_bits: int) -> None:
        self._dimension, self._dtype = dimension, dtype
        self._scratch = _scratch(dimension, dtype)
        self._mask = dtype((1 << modulus_bits) - 1)
        self._full_width = modulus_bits == np.dtype(dtype).itemsize * 8

    def fresh(self, key: bytes) -> np.ndarray:
        """A new vector holding the keystream of `key` (saves a copy for the first mask)."""
        return KeystreamBuffer(self._dimension, self._dtype).fill(key)

    def add(self, target: np.ndarray, key: bytes) -> None:
        np.add(target, self._scratch.fill(key), out=target)

    def subtract(self, target: np.ndarray, key: bytes) -> None:
        np.subtract(target, self._scratch.fill(key), out=target)

    def reduce(self, target: np.ndarray) -> None:
        """Bring every coordinate into [0, 2^b)."""
        if not self._full_width:
            np.bitwise_and(target, self._mask, out=target)
