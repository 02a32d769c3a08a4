"""Cohort sampling statistics for both schemes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedveil.server.engine.sampling import CohortSampler


def test_fixed_size_is_exact_and_uniform():
    n, m, rounds = 50, 10, 3000
    s = CohortSampler(n, "fixed", m, 0.0, seed=3)
    counts = np.zeros(n)
    for _ in range(rounds):
        cohort = s.sample()
        assert len(cohort) == m and len(set(cohort)) == m
        counts[cohort] += 1
    # Each client is included with probability m/n: chi-square against uniform.
    _, p = stats.chisquare(counts)
    assert p > 1e-3
    assert counts.sum() == m * rounds


def test_poisson_sizes_and_inclusion_rate():
    n, q, rounds = 200, 0.05, 3000
    s = CohortSampler(n, "poisson", 0, q, seed=4)
    sizes = np.array([len(s.sample()) for _ in range(rounds)])
    # Size ~ Binomial(n, q): mean n*q, variance n*q*(1-q).
    assert abs(sizes.mean() - n * q) < 4 * np.sqrt(n * q * (1 - q) / rounds)
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.15)
    assert sizes.min() < sizes.max()  # varies, unlike fixed-size sampling


def test_same_seed_same_cohorts_and_state_restore():
    a = CohortSampler(30, "fixed", 5, 0.0, seed=9)
    b = CohortSampler(30, "fixed", 5, 0.0, seed=9)
    assert [a.sample() for _ in range(5)] == [b.sample() for _ in range(5)]
    state = a.state()
    nxt = a.sample()
    b.restore(state)
    assert b.sample() == nxt


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="per_round = 40"):
        CohortSampler(30, "fixed", 40, 0.0, seed=0)
    with pytest.raises(ValueError, match="sample_rate = 0"):
        CohortSampler(30, "poisson", 0, 0.0, seed=0)
