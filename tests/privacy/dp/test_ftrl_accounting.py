"""DP-FTRL epsilon: the Gaussian mechanism over the factorisation's sensitivity (PLD)."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from scipy import optimize, stats

from fedveil.privacy.dp.ftrl import (
    ParticipationSchema,
    TreeFactorization,
    calibrate_ftrl_noise_multiplier,
    ftrl_epsilon,
)
from fedveil.privacy.dp.ftrl.ftrl_accounting import epsilon_after
from fedveil.privacy.dp.ftrl.optimize import banded_factorization


def _exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Balle and Wang 2018: the exact (epsilon, delta) curve of N(0, sigma^2), sensitivity 1."""

    def gap(eps: float) -> float:
        a = stats.norm.cdf(-eps * sigma + 1 / (2 * sigma))
        b = math.exp(eps) * stats.norm.cdf(-eps * sigma - 1 / (2 * sigma))
        return a - b - delta

    return optimize.brentq(gap, 0.0, 500.0, xtol=1e-12)


@pytest.mark.parametrize(("rounds", "z"), [(100, 1.0), (1000, 0.6), (64, 2.5)])
def test_tree_single_participation_lies_between_exact_gaussian_and_dp_accounting_rdp(
    rounds: int, z: float
) -> None:
    delta = 1e-6
    tree = TreeFactorization(rounds)
    sensitivity = tree.sensitivity(ParticipationSchema())
    ours = ftrl_epsilon(z, delta)  # noise std per node = z x sensitivity (unit clip)
    exact = _exact_gaussian_epsilon(z, delta)
    account = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    )
    # dp-accounting's event: noise per node over one node's sensitivity (1).
    account.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(z * sensitivity, rounds))
    rdp = account.get_epsilon(delta)
    assert exact <= ours <= rdp
    assert ours <= exact * 1.01  # PLD at 1e-4 is tight, not just sound


def test_replace_one_doubles_the_sensitivity() -> None:
    delta = 1e-6
    # Replace-one at z is zero-out at z / 2: the distance between outputs doubles.
    assert ftrl_epsilon(2.0, delta, "replace_one") == pytest.approx(
        ftrl_epsilon(1.0, delta, "zero_out"), rel=2e-3
    )
    with pytest.raises(ValueError, match=r"dp\.neighbouring='add_remove'"):
        ftrl_epsilon(1.0, delta, "add_remove")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_noise_multiplier_fails_closed(bad: float) -> None:
    with pytest.raises(ValueError, match=r"dp\.noise_multiplier"):
        ftrl_epsilon(bad, 1e-6)


@pytest.mark.parametrize("target", [2.0, 8.0])
def test_calibration_meets_the_target_and_no_more(target: float) -> None:
    z = calibrate_ftrl_noise_multiplier(target, 1e-6)
    assert ftrl_epsilon(z, 1e-6) <= target
    assert ftrl_epsilon(z * (1 - 3e-3), 1e-6) > target


def test_budget_before_each_release_grows_to_the_full_epsilon() -> None:
    rounds, schema = 40, ParticipationSchema(5, 8)
    f = banded_factorization(rounds, schema, iterations=10)
    z, delta = 1.5, 1e-6
    spent = [epsilon_after(f, schema, z, t, delta) for t in (1, 5, 20, 40)]
    assert spent == sorted(spent)
    assert spent[0] < spent[-1] == pytest.approx(ftrl_epsilon(z, delta))
    with pytest.raises(ValueError, match="extending T is refused"):
        epsilon_after(f, schema, z, 41, delta)
