"""The single source of randomness of the protocol: the OS CSPRNG.

Every key, seed, nonce and polynomial coefficient comes from `random_bytes`, so tests can swap
it for a deterministic generator in one place (see tests/privacy/secagg/conftest.py).
Production code must never replace it.
"""

from __future__ import annotations

import os


def random_bytes(n: int) -> bytes:
    """Return `n` bytes from the operating system's CSPRNG."""
    return os.urandom(n)


def random_below(bound: int) -> int:
    """Uniform integer in [0, bound) by rejection sampling over `random_bytes`."""
    if bound <= 0:
        raise ValueError("bound must be positive")
    bits = (bound - 1).bit_length()
    nbytes = (bits + 7) // 8
    excess = nbytes * 8 - bits
    while True:
        value = int.from_bytes(random_bytes(nbytes), "big") >> excess
        if value < bound:
            return value
