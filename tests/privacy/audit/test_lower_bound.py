"""The one-run lower bound (Steinke, Nasr, Jagielski 2023): known values and shape."""

import math

import numpy as np
import pytest

from fedveil.privacy.audit import binomial_epsilon_bound, one_run_lower_bound, steinke_tail


def test_all_guesses_right_at_1000_gives_about_5_8():
    # The figure: the most a 95% bound can say with 1000 guesses.
    eps = binomial_epsilon_bound(1000, 1000, 0.05)
    p = 0.05 ** (1 / 1000)
    assert eps == pytest.approx(math.log(p / (1 - p)), abs=1e-6)
    assert 5.7 < eps < 5.9


def test_chance_level_guesses_give_zero():
    assert binomial_epsilon_bound(1000, 500, 0.05) == 0.0
    assert binomial_epsilon_bound(1000, 520, 0.05) == 0.0  # within chance at 95%
    assert binomial_epsilon_bound(0, 0, 0.05) == 0.0


def test_bound_grows_with_correct_guesses_and_with_confidence_lost():
    values = [binomial_epsilon_bound(200, v, 0.05) for v in range(100, 201, 10)]
    assert values == sorted(values) and values[-1] > values[0]
    assert binomial_epsilon_bound(200, 180, 0.01) < binomial_epsilon_bound(200, 180, 0.1)


def test_bound_is_the_edge_of_the_binomial_tail():
    from scipy.stats import binom

    eps = binomial_epsilon_bound(300, 270, 0.05)
    tail = lambda e: binom.sf(269, 300, 1 / (1 + math.exp(-e)))  # noqa: E731
    assert tail(eps) <= 0.05 < tail(eps + 1e-3)


def test_random_scores_give_about_zero_and_perfect_scores_the_maximum():
    rng = np.random.default_rng(1)
    included = rng.random(1000) < 0.5
    random = one_run_lower_bound(rng.standard_normal(1000), included)
    assert random.epsilon < 0.5
    perfect = one_run_lower_bound(included.astype(float) + 0.01 * rng.random(1000), included)
    # Perfect separation: all 500 guesses (a quarter each way) right, at 99%.
    assert perfect.correct == perfect.guesses == 500
    assert perfect.epsilon == pytest.approx(binomial_epsilon_bound(500, 500, 0.01))


def test_the_delta_term_is_included_and_caps_what_more_canaries_reach():
    # Issue 28: with p = beta + 2 m delta alpha, perfect guessing at delta = 1e-5 and 99%
    # reaches about 5.9 at 5,000 canaries and no more at 15,000 (the term grows with m),
    # where the pure-DP statement would claim 7.4: the bound never gets to epsilon 8.
    reached = {}
    for m in (5000, 15000):
        pure = binomial_epsilon_bound(m // 2, m // 2, 0.01)
        reached[m] = binomial_epsilon_bound(m // 2, m // 2, 0.01, canaries=m, delta=1e-5)
        assert reached[m] < pure
        tail = steinke_tail(reached[m], m // 2, m // 2, m, 1e-5)
        assert tail <= 0.01 < steinke_tail(reached[m] + 1e-3, m // 2, m // 2, m, 1e-5)
    assert pure > 7.0
    assert 5.5 < reached[5000] < 6.0 and reached[15000] < 6.0
    included = np.arange(2000) % 2 == 0
    bound = one_run_lower_bound(included.astype(float), included, delta=1e-5)
    assert bound.to_json()["delta_used"] == 1e-5 and bound.epsilon < 5.5


def test_a_lower_bound_never_exceeds_a_true_mechanisms_epsilon_by_much():
    # Randomised response with eps = 1 on each canary: the bound must stay below 1
    # (at 95%: here over 20 seeds, at most a couple may exceed it).
    eps_true, above = 1.0, 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        included = rng.random(2000) < 0.5
        keep = rng.random(2000) < math.exp(eps_true) / (1 + math.exp(eps_true))
        answer = np.where(keep, included, ~included).astype(float)
        above += one_run_lower_bound(answer + 1e-3 * rng.random(2000), included).epsilon > eps_true
    assert above <= 2


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="correct"):
        binomial_epsilon_bound(10, 11)
    with pytest.raises(ValueError, match="inclusion flags"):
        one_run_lower_bound(np.zeros(5), np.zeros(4, bool))
