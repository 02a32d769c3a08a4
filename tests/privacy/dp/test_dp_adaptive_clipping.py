import numpy as np
import pytest

from fedveil.privacy.dp import (
    clip_indicator,
    next_clip_norm,
    noised_count,
    total_noise_multiplier,
    update_noise_multiplier,
)


def test_indicator_is_one_for_unclipped_updates():
    assert clip_indicator(np.array([0.3, 0.4]), 0.5) == 1
    assert clip_indicator(np.array([3.0, 4.0]), 0.5) == 0


def test_clip_norm_moves_geometrically_toward_the_quantile():
    # Everyone unclipped (b = 1) -> shrink; nobody unclipped (b = 0) -> grow.
    assert next_clip_norm(1.0, 100, 100) == pytest.approx(np.exp(-0.2 * 0.5))
    assert next_clip_norm(1.0, 0, 100) == pytest.approx(np.exp(0.2 * 0.5))


@pytest.mark.parametrize("quantile", [0.3, 0.5, 0.8])
def test_adaptive_clip_norm_tracks_target_quantile_of_population(quantile):
    rng = np.random.default_rng(11)
    population = rng.lognormal(mean=0.0, sigma=0.6, size=5000)  # update norms
    cohort = 100
    clip = 0.1  # Andrew et al. default C0, far below the population's norms
    history = []
    for _ in range(300):
        norms = rng.choice(population, size=cohort, replace=False)
        count = sum(clip_indicator(np.array([norm]), clip) for norm in norms)
        noisy = noised_count(count, cohort / 20, rng=rng)
        clip = next_clip_norm(clip, noisy, cohort, target_quantile=quantile, learning_rate=0.2)
        history.append(clip)
    settled = np.mean(history[-100:])
    low, high = np.quantile(population, [quantile - 0.1, quantile + 0.1])
    assert low <= settled <= high


def test_noise_split_between_count_and_update_composes_back():
    z_update = update_noise_multiplier(1.0, 5.0)
    assert z_update > 1.0
    assert total_noise_multiplier(z_update, 5.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="count_stddev"):
        update_noise_multiplier(5.0, 5.0)
