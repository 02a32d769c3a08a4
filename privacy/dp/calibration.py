"""Noise calibration: the smallest noise multiplier that meets an (epsilon, delta) target."""

from __future__ import annotations

import math

from fedveil.protocol.dp_rules import (
    AUTO,
    CENTRAL_GAUSSIAN,
    POISSON,
    default_accountant,
    default_neighbouring,
    sound_accountants,
)

from .accounting import compute_epsilon
from .events import PrivacyEvent

_MAX_BRACKET_DOUBLINGS = 40


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    rounds: int,
    sampling_rate: float,
    *,
    sampling: str = POISSON,
    neighbouring: str = AUTO,
    population_size: int | None = None,
    steps_per_round: int = 1,
    accountant: str = AUTO,
    mechanism: str = CENTRAL_GAUSSIAN,
    rel_tol: float = 1e-3,
) -> float:
    """Smallest z (within `rel_tol`) such that `rounds` rounds cost <= target_epsilon.

    Brackets by doubling, then solves epsilon(z) = target; the returned z is always
    checked to meet the target, never a hair below the needed noise. `neighbouring`
    and `accountant` may be 'auto' (dp_rules.default_neighbouring/default_accountant
    for `mechanism`); an accountant that is not sound for `mechanism` is refused.
    For distributed Skellam the result is the Gaussian-equivalent z to reach.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon={target_epsilon!r} is invalid; allowed: > 0")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds={rounds!r} is invalid; allowed: an integer >= 1")
    from scipy import optimize  # lazy: not needed by clients importing this package

    if neighbouring == AUTO:
        neighbouring = default_neighbouring(mechanism, sampling)
    if accountant == AUTO:
        accountant = default_accountant(mechanism, sampling, neighbouring)
    sound = sound_accountants(mechanism, sampling, neighbouring)
    if accountant not in sound:
        raise ValueError(
            f"accountant={accountant!r} is not sound for mechanism={mechanism!r} with "
            f"sampling={sampling!r}, neighbouring={neighbouring!r}; allowed: {sound}"
        )

    def epsilon(z: float) -> float:
        event = PrivacyEvent(
            z, sampling_rate, rounds * steps_per_round, sampling, neighbouring, population_size
        )
        return compute_epsilon([event], delta, accountant)

    low, high = 0.25, 1.0
    for _ in range(_MAX_BRACKET_DOUBLINGS):
        if epsilon(high) <= target_epsilon:
            break
        low, high = high, high * 2
    else:
        raise ValueError(f"no noise multiplier up to {high:g} reaches epsilon={target_epsilon}")
    while low > 1e-3 and epsilon(low) <= target_epsilon:
        low, high = low / 2, low
    # epsilon(z) is continuous and decreasing: Brent's method needs ~6 evaluations
    # where plain bisection needs ~12 (each can cost a second with PLD).
    root = optimize.brentq(lambda z: epsilon(z) - target_epsilon, low, high, rtol=rel_tol / 4)
    z = min(high, root * (1 + rel_tol / 2))
    while epsilon(z) > target_epsilon:  # land on the safe side of the target
        z = min(high, z * (1 + rel_tol / 2))
    return z
