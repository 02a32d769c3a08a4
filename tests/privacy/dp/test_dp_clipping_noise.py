import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedveil.privacy.dp import add_gaussian_noise, clip_l2, l2_norm


@settings(max_examples=100, deadline=None)
@given(
    arrays(
        np.float32, st.integers(1, 300), elements=st.floats(-1e6, 1e6, allow_nan=False, width=32)
    ),
    st.floats(1e-4, 1e4),
)
def test_every_clipped_update_has_norm_at_most_c(update, clip_norm):
    clipped = clip_l2(update, clip_norm)
    assert clipped.dtype == np.float32
    assert np.linalg.norm(clipped.astype(np.float64)) <= clip_norm
    if np.linalg.norm(update.astype(np.float64)) <= clip_norm:
        np.testing.assert_array_equal(clipped, update)


def test_clipping_keeps_direction_and_accepts_torch():
    update = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    clipped = clip_l2(update, 1.0)
    np.testing.assert_allclose(clipped, [0.6, 0.8, 0.0, 0.0], rtol=1e-6)
    assert l2_norm(update) == pytest.approx(5.0)


def test_clipping_rejects_nan_and_bad_norms():
    with pytest.raises(ValueError, match="NaN"):
        clip_l2(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        clip_l2(np.ones(3), 0.0)


def test_central_noise_variance_matches_z_c_squared_chi_square_ci():
    z, c, n = 1.3, 0.7, 200_000
    noised = add_gaussian_noise(np.zeros(n, np.float32), z, c, rng=np.random.default_rng(7))
    sample_var = float(np.var(noised.astype(np.float64), ddof=1))
    # (n-1) s^2 / sigma^2 ~ chi2(n-1): 99.9% confidence interval for sigma^2.
    low = (n - 1) * sample_var / stats.chi2.ppf(0.9995, n - 1)
    high = (n - 1) * sample_var / stats.chi2.ppf(0.0005, n - 1)
    assert low <= (z * c) ** 2 <= high
    assert abs(float(np.mean(noised))) < 5 * z * c / math.sqrt(n)


def test_central_noise_is_added_to_the_sum_and_not_reproducible_without_seed():
    total = np.arange(5, dtype=np.float32)
    first = add_gaussian_noise(total, 1.0, 1.0)
    second = add_gaussian_noise(total, 1.0, 1.0)
    assert not np.array_equal(first, second)
    near = add_gaussian_noise(total, 1e-6, 1.0)
    np.testing.assert_allclose(near, total, atol=1e-4)
