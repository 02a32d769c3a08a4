"""Epsilon of DP-FTRL: one Gaussian mechanism on C x, without amplification.

The whole run releases C x + sigma xi with sigma = z x clip x sensitivity(C, schema),
so against outside observers it is the Gaussian mechanism at noise multiplier z over
its sensitivity, whatever the factorisation (the decoder B is post-processing).
Epsilon comes from dp-accounting's PLD (pessimistic discretisation: an upper bound).
After t of T releases only the first t releases are out: their sensitivity
(the factorisation truncated to t) is at most the full one, so the effective
multiplier is z x sensitivity_T / sensitivity_t, and the budget is checked with it
before each release. Zero-out adjacency: one client's contributions become zero;
replace-one doubles the distance (dp-accounting's REPLACE_ONE, the same z).
"""

from __future__ import annotations

import math
from functools import lru_cache

from fedveil.protocol.dp_rules import REPLACE_ONE, ZERO_OUT

from .factorizations import Factorization
from .schema import ParticipationSchema

FTRL_NEIGHBOURING = (ZERO_OUT, REPLACE_ONE)
PLD_DISCRETIZATION = 1e-4
_BISECTION_STEPS = 60


def ftrl_epsilon(noise_multiplier: float, delta: float, neighbouring: str = ZERO_OUT) -> float:
    """Epsilon at `delta` of the Gaussian mechanism at `noise_multiplier` (sensitivity 1)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(
            f"dp.noise_multiplier={noise_multiplier!r} is invalid; allowed: a finite number > 0"
        )
    if not (0 < delta < 1):
        raise ValueError(f"dp.delta={delta!r} is invalid; allowed: (0, 1)")
    if neighbouring not in FTRL_NEIGHBOURING:
        raise ValueError(
            f"dp.neighbouring={neighbouring!r} is invalid for dp.mechanism = 'ftrl'; "
            f"allowed: {FTRL_NEIGHBOURING} (no sampling: add/remove would change T)"
        )
    return _pld_epsilon(float(noise_multiplier), float(delta), neighbouring)


@lru_cache(maxsize=256)
def _pld_epsilon(noise_multiplier: float, delta: float, neighbouring: str) -> float:
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution

    relation = (
        dp_accounting.NeighboringRelation.REPLACE_ONE
        if neighbouring == REPLACE_ONE
        else dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    )
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        sensitivity=1.0,
        value_discretization_interval=PLD_DISCRETIZATION,
        neighboring_relation=relation,
    )
    epsilon = float(pld.get_epsilon_for_delta(delta))
    return epsilon if math.isfinite(epsilon) else math.inf


def epsilon_after(
    factorization: Factorization,
    schema: ParticipationSchema,
    noise_multiplier: float,
    releases: int,
    delta: float,
    neighbouring: str = ZERO_OUT,
) -> float:
    """Epsilon once `releases` of the T planned releases are out (0 before the first)."""
    if releases <= 0:
        return 0.0
    if not (releases <= factorization.rounds):
        raise ValueError(
            f"release {releases} is invalid; allowed: <= the planned rounds "
            f"{factorization.rounds} (extending T is refused)"
        )
    full = factorization.sensitivity(schema)
    part = factorization.truncated(releases).sensitivity(schema)
    return ftrl_epsilon(noise_multiplier * full / part, delta, neighbouring)


def calibrate_ftrl_noise_multiplier(
    target_epsilon: float, delta: float, neighbouring: str = ZERO_OUT, rel_tol: float = 1e-3
) -> float:
    """Smallest z (within `rel_tol`, checked to meet the target) with epsilon <= target.

    Independent of T, schema and factorisation: they set the sensitivity, and the
    noise standard deviation is z x clip x sensitivity.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"dp.epsilon={target_epsilon!r} is invalid; allowed: a finite number > 0")
    # The exact curve (Balle and Wang 2018) places z within a hair; PLD, pessimistic,
    # then decides: z grows by rel_tol until the PLD epsilon meets the target.
    scale = 2.0 if neighbouring == REPLACE_ONE else 1.0
    z = scale * _exact_gaussian_multiplier(target_epsilon, delta)
    for _ in range(_BISECTION_STEPS):
        if ftrl_epsilon(z, delta, neighbouring) <= target_epsilon:
            return z
        z *= 1 + rel_tol
    raise ValueError(f"dp.epsilon={target_epsilon!r} is unreachable at delta={delta!r}")


def _exact_gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    from scipy import stats

    a = 1 / (2 * noise_multiplier)
    return float(
        stats.norm.cdf(a - epsilon * noise_multiplier)
        - math.exp(epsilon) * stats.norm.cdf(-a - epsilon * noise_multiplier)
    )


def _exact_gaussian_multiplier(target_epsilon: float, delta: float) -> float:
    """The z at which the Gaussian mechanism (sensitivity 1) is exactly (epsilon, delta)-DP."""
    if not (0 < delta < 1):
        raise ValueError(f"dp.delta={delta!r} is invalid; allowed: (0, 1)")
    low, high = 1e-3, 1.0
    while _exact_gaussian_delta(high, target_epsilon) > delta:
        low, high = high, high * 2
        if high > 1e6:
            raise ValueError(f"dp.epsilon={target_epsilon!r} is unreachable at delta={delta!r}")
    for _ in range(100):
        mid = (low + high) / 2
        if _exact_gaussian_delta(mid, target_epsilon) > delta:
            low = mid
        else:
            high = mid
    return high
