"""DP-FTRL: correlated noise on the prefix sums of the round updates (matrix mechanisms).

A factorisation A = B C of the prefix-sum matrix A (lower-triangular ones, T x T)
turns the T round sums x into the release B (C x + sigma xi): the server adds the
correlated noise w = C^-1 xi (sigma-scaled) to each round's sum, so the running model
carries the noise B xi on its prefix sums. Privacy comes from the participation
schema (how often, and how far apart, one client may take part), not from sampling:

- `schema.ParticipationSchema`: single participation, or min-separation b with at
  most k participations;
- `factorizations`: identity (DP-FedAvg without amplification), binary tree, banded
  Toeplitz, BLT; each computes its sensitivity under a schema;
- `optimize`: the banded and BLT coefficients, by a small optimisation;
- `accounting`: epsilon of the Gaussian mechanism at noise multiplier z over that
  sensitivity (PLD, no amplification), calibration;
- `noise`: the stateful noise generator (OS CSPRNG), persisted before each release and
  following the ledger's release index.

Nothing here knows the round engine: `noise.FtrlNoise.next_noise` is the one call a
release mechanism makes per release.
"""

from __future__ import annotations

from .factorizations import (
    BandedFactorization,
    BltFactorization,
    Factorization,
    IdentityFactorization,
    TreeFactorization,
    factorization_from_dict,
)
from .ftrl_accounting import calibrate_ftrl_noise_multiplier, ftrl_epsilon
from .noise import FtrlNoise, NoiseStateError
from .schema import ParticipationSchema

__all__ = [
    "BandedFactorization",
    "BltFactorization",
    "Factorization",
    "FtrlNoise",
    "IdentityFactorization",
    "NoiseStateError",
    "ParticipationSchema",
    "TreeFactorization",
    "calibrate_ftrl_noise_multiplier",
    "factorization_from_dict",
    "ftrl_epsilon",
]
