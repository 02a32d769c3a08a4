"""Noise generators seeded from the OS CSPRNG.

Production paths never use a fixed seed: a predictable seed would let anyone who
knows it subtract the noise. Tests inject their own generator instead.
"""

from __future__ import annotations

import secrets

import numpy as np

_SEED_BITS = 128


def secure_generator() -> np.random.Generator:
    """A numpy generator whose seed comes from `secrets` (the OS CSPRNG)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(_SEED_BITS)))


def resolve_generator(rng: np.random.Generator | None) -> np.random.Generator:
    """The injected generator (tests) or a fresh CSPRNG-seeded one (production)."""
    return rng if rng is not None else secure_generator()
