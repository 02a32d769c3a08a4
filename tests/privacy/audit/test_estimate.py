"""The one-shot estimate (Andrew et al. 2024): the two-Gaussian epsilon and its interval."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from fedveil.privacy.audit import (
    dirac_coordinates,
    estimate_epsilon,
    gaussian_pair_epsilon,
    hockey_stick,
    projection_sums,
)


def gaussian_mechanism_delta(mu: float, eps: float) -> float:
    # Balle & Wang 2018: the exact delta(eps) of the Gaussian mechanism at mu = sens/sigma.
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0, 4.0])
def test_equal_variances_match_the_gaussian_mechanism(mu):
    for eps in (0.0, 0.5, 2.0):
        assert hockey_stick(mu, 1.0, 0.0, 1.0, eps) == pytest.approx(
            gaussian_mechanism_delta(mu, eps), abs=1e-12
        )
    eps = gaussian_pair_epsilon(mu, 1.0, 0.0, 1.0, 1e-5)
    assert gaussian_mechanism_delta(mu, eps) == pytest.approx(1e-5, rel=1e-4)


def test_epsilon_grows_with_separation_and_is_zero_for_identical_gaussians():
    values = [gaussian_pair_epsilon(m, 1.0, 0.0, 1.0, 1e-5) for m in (0.0, 0.5, 1, 2, 4)]
    assert values[0] == 0.0
    assert values == sorted(values)


def test_unequal_variances_cost_epsilon_even_with_equal_means():
    assert gaussian_pair_epsilon(0.0, 2.0, 0.0, 1.0, 1e-5) > 1.0


def test_estimate_recovers_a_known_gaussian_mechanism_with_an_interval():
    rng = np.random.default_rng(0)
    mu = 2.0
    truth = gaussian_pair_epsilon(mu, 1.0, 0.0, 1.0, 1e-5)
    est = estimate_epsilon(rng.normal(mu, 1, 1000), rng.normal(0, 1, 1000), 1e-5, seed=1)
    lo, hi = est.interval
    assert lo <= truth <= hi
    assert est.epsilon == pytest.approx(truth, rel=0.15)
    nothing = estimate_epsilon(rng.normal(0, 1, 1000), rng.normal(0, 1, 1000), 1e-5)
    assert nothing.epsilon < 0.5 and nothing.interval[0] < 0.1
    # The unequal-variance reading of the same null samples: sampling noise in two sigmas
    # alone already reads as epsilon (why it is not the headline).
    assert nothing.epsilon_unequal_variance > nothing.epsilon


def test_dirac_canaries_are_seeded_distinct_and_at_most_one_per_coordinate():
    a = dirac_coordinates(7, 50, 4000)
    assert len(set(a.tolist())) == 50 and a.min() >= 0 and a.max() < 4000
    assert np.array_equal(a, dirac_coordinates(7, 50, 4000))
    assert not np.array_equal(a, dirac_coordinates(8, 50, 4000))
    assert len(set(dirac_coordinates(1, 610, 610).tolist())) == 610
    with pytest.raises(ValueError, match="supports at most 610 Dirac canaries"):
        dirac_coordinates(1, 2000, 610)


def test_the_statistic_finds_the_inserted_canaries_without_interference():
    c = dirac_coordinates(3, 20, 2000)
    initial = np.zeros(2000)
    final = initial.copy()
    final[c[:10]] += 1.0  # the inserted canaries, summed over rounds
    scores = projection_sums(c, initial, final)
    assert np.array_equal(scores, [1.0] * 10 + [0.0] * 10)


def test_the_bootstraps_fast_equal_variance_path_is_the_general_one_bit_for_bit():
    # The bootstrap's shortcut must not change an audit's figures: same floats, every case
    # (half-lines both ways, equal means, eps = 0 and the EPS_MAX cap, tiny and large sigma).
    from fedveil.privacy.audit.estimate import EPS_MAX, _equal_variance_epsilon

    rng = np.random.default_rng(7)
    got = []
    for i in range(600):
        sigma = float(10 ** rng.uniform(-4, 1))
        mu_in = float(rng.normal(0, sigma * 10 ** rng.uniform(-2, 1.5)))
        mu_out = mu_in if i % 10 == 0 else float(rng.normal(0, sigma))
        delta = float(10 ** rng.uniform(-8, -1))
        general = gaussian_pair_epsilon(mu_in, sigma, mu_out, sigma, delta)
        assert _equal_variance_epsilon(mu_in, mu_out, sigma, delta) == general
        got.append(general)
    assert 0.0 in got and EPS_MAX in got and any(0 < e < EPS_MAX for e in got)
