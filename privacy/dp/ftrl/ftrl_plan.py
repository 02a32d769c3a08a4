"""A run's DP-FTRL plan from its config: schema, factorisation, z, expected noise.

Deterministic in the config (the banded/BLT optimisation has no randomness), so the
server, `simulate`'s warning and a resume all build the same factorisation; cached.
"""

from __future__ import annotations

import math
from functools import lru_cache

from fedveil.protocol.dp_parameters import DpParameters
from fedveil.protocol.dp_rules import REPLACE_ONE, ZERO_OUT

from .factorizations import Factorization, TreeFactorization
from .ftrl_accounting import calibrate_ftrl_noise_multiplier
from .optimize import banded_factorization, blt_factorization
from .schema import ParticipationSchema


def ftrl_schema(p: DpParameters) -> ParticipationSchema:
    """The run's participation schema (dp.ftrl_min_separation 0: single participation)."""
    b = p.ftrl_min_separation
    if b == 0:
        return ParticipationSchema()
    return ParticipationSchema(b, p.ftrl_max_participations)


def ftrl_factorization(p: DpParameters) -> Factorization:
    """The factorisation for T = server.rounds under the run's schema."""
    schema = ftrl_schema(p)
    return _factorization(p.ftrl_factorization, p.rounds, schema)


@lru_cache(maxsize=8)
def _factorization(kind: str, rounds: int, schema: ParticipationSchema) -> Factorization:
    if kind == "tree":
        return TreeFactorization(rounds)
    if kind == "banded":
        return banded_factorization(rounds, schema)
    if kind == "blt":
        return blt_factorization(rounds, schema)
    raise ValueError(f"dp.ftrl_factorization={kind!r} is invalid; allowed: tree, banded, blt")


def ftrl_neighbouring(p: DpParameters) -> str:
    """zero_out ('auto') or replace_one (twice the distance)."""
    return REPLACE_ONE if p.neighbouring == "replace_one" else ZERO_OUT


def ftrl_noise_multiplier(p: DpParameters) -> float:
    """dp.noise_multiplier, or z calibrated for dp.epsilon at dp.delta."""
    given = float(p.noise_multiplier)
    if given > 0:
        return given
    return calibrate_ftrl_noise_multiplier(p.epsilon, p.delta, ftrl_neighbouring(p))


def equivalent_noise_multiplier(p: DpParameters) -> float:
    """The per-round z of independent noise that would leave the same noise on the last
    prefix sum: z x sensitivity x ||B_T|| / sqrt(T) (what the noise-to-signal warning uses)."""
    f = ftrl_factorization(p)
    z = ftrl_noise_multiplier(p)
    return z * f.sensitivity(ftrl_schema(p)) * f.prefix_noise_std() / math.sqrt(f.rounds)
