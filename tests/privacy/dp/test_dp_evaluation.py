"""Federated evaluation as a DP release (privacy/dp/evaluation.py): a device's contribution is
bounded whatever it computed, one evaluation's z meets its epsilon with the accountant,
evaluations compose through it, and the released means are clamped post-processing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedveil.privacy.dp import compute_epsilon
from fedveil.privacy.dp.evaluation import (
    ACCOUNTANT,
    SENSITIVITY,
    EvaluationPlan,
    composed_epsilon,
    contribution,
)


@pytest.mark.parametrize(
    ("accuracy", "loss", "expected"),
    [(0.5, 1.0, [0.5, 0.25]), (1.7, 99.0, [1.0, 1.0]), (-0.2, -3.0, [0.0, 0.0])],
)
def test_a_contribution_is_clamped_into_the_unit_square(accuracy, loss, expected):
    vector = contribution(accuracy, loss, 4.0)
    assert vector.tolist() == pytest.approx(expected)
    # With the device's unit count the sum moves by at most the stated sensitivity.
    assert math.hypot(1.0, *vector) <= SENSITIVITY + 1e-12


def test_a_contribution_without_a_result_or_cap_is_refused():
    with pytest.raises(ValueError, match="not finite"):
        contribution(float("nan"), 1.0, 4.0)
    with pytest.raises(ValueError, match=r"loss_cap = 0\.0"):
        contribution(0.5, 1.0, 0.0)


def test_one_evaluation_meets_its_epsilon_and_several_compose():
    plan = EvaluationPlan.calibrate(1.0, 1e-6, 5.0)
    single = compute_epsilon([plan.event()], 1e-6, ACCOUNTANT)
    assert 0.99 < single <= 1.0  # calibrated, never a hair below the noise it needs
    assert plan.noise_std == pytest.approx(plan.noise_multiplier * math.sqrt(3))
    config = plan.dp_config()
    assert (config.mechanism, config.sampling_rate, config.neighbouring) == (
        "central_gaussian",
        1.0,
        "add_remove",
    )
    assert config.clip_norm == SENSITIVITY and config.budget_epsilon == 1.0
    two = composed_epsilon([plan.event()] * 2, 1e-6)
    assert single < two < 2 * single  # tighter than adding the epsilons up
    assert composed_epsilon([], 1e-6) == 0.0
    assert EvaluationPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ValueError, match="epsilon = -1"):
        EvaluationPlan(-1.0, 1e-6, 1.0, 5.0)


def test_the_release_is_the_noised_sums_ratio_clamped_to_range():
    plan = EvaluationPlan(1.0, 1e-6, 2.0, 4.0)
    rng = np.random.default_rng(7)  # tests only: production draws from the OS CSPRNG
    many = [plan.release(1000.0, 300.0, 125.0, rng) for _ in range(400)]
    accuracies = np.array([r.accuracy for r in many])
    assert abs(accuracies.mean() - 0.3) < 0.002  # ~noise_std * 1.04 / 1000 per draw
    assert np.mean([r.loss for r in many]) == pytest.approx(0.5, abs=0.01)
    # Few devices, much noise: still within [0, 1] and [0, cap], never the raw ratio.
    few = [plan.release(2.0, 1.0, 2.0, rng) for _ in range(200)]
    assert all(0.0 <= r.accuracy <= 1.0 and 0.0 <= r.loss <= 4.0 for r in few)
    assert {r.accuracy for r in few} & {0.0, 1.0}
