import math

import numpy as np
import pytest

from fedveil.privacy.dp import SkellamEncoder, SkellamParams, clip_l2
from fedveil.privacy.dp.hadamard import rotate, unrotate, walsh_hadamard


def signed(codes, modulus):
    values = codes.astype(np.int64)
    values[values >= modulus // 2] -= modulus
    return values


def run_round(params, updates, seed=5, rotation_seed=2024):
    encoder = SkellamEncoder(params, rotation_seed, rng=np.random.default_rng(seed))
    # Clients clip once (the runtime); the encoder only checks the bound.
    codes = [encoder.encode(clip_l2(update, params.clip_norm)) for update in updates]
    for code in codes:
        assert code.dtype == np.uint32 and int(code.max()) < params.modulus
    unreduced = sum(signed(code, params.modulus) for code in codes)  # what wrapping would hide
    modular_sum = np.mod(sum(code.astype(np.int64) for code in codes), params.modulus)
    return encoder.decode(modular_sum, len(updates)), unreduced


def test_hadamard_rotation_is_orthonormal_and_invertible():
    rng = np.random.default_rng(0)
    x = rng.normal(size=37)
    rotated = rotate(x, rotation_seed=9)
    assert rotated.shape == (64,)
    assert np.linalg.norm(rotated) == pytest.approx(np.linalg.norm(x))
    np.testing.assert_allclose(unrotate(rotated, 9, 37), x, atol=1e-12)
    np.testing.assert_allclose(
        walsh_hadamard(walsh_hadamard(np.arange(8.0))), np.arange(8.0), atol=1e-12
    )


def test_decoded_sum_matches_clipped_sum_within_the_expected_noise():
    dim, clients = 3000, 20
    params = SkellamParams.calibrate(
        dim=dim, clip_norm=1.0, noise_multiplier=0.8, num_clients=clients, bits=18
    )
    rng = np.random.default_rng(1)
    updates = [rng.normal(size=dim) * scale for scale in rng.uniform(0.005, 0.1, clients)]
    decoded, unreduced = run_round(params, updates)
    truth = sum(clip_l2(update, 1.0).astype(np.float64) for update in updates)
    error = decoded.astype(np.float64) - truth
    # Noise: Skellam variance n*mu plus rounding variance <= 1/4 per client, in units 1/s^2.
    low = clients * params.local_variance / params.scale**2
    high = (clients * params.local_variance + clients / 4) / params.scale**2
    observed = float(np.mean(error**2))
    assert low * 0.9 <= observed <= high * 1.1
    assert params.noise_stddev_for(clients) == pytest.approx(math.sqrt(low))
    assert np.max(np.abs(unreduced)) < params.modulus // 2  # no wrap-around


def test_no_wrap_even_when_all_clients_send_the_same_spiky_update():
    dim, clients = 1000, 50
    params = SkellamParams.calibrate(
        dim=dim, clip_norm=0.5, noise_multiplier=1.0, num_clients=clients, bits=16
    )
    spike = np.zeros(dim)
    spike[3] = 10.0  # clipped to norm 0.5, all mass on one coordinate before rotation
    decoded, unreduced = run_round(params, [spike] * clients)
    assert np.max(np.abs(unreduced)) < params.modulus // 2
    assert decoded[3] == pytest.approx(clients * 0.5, abs=6 * params.noise_stddev_for(clients))


def test_gaussian_equivalent_dominates_the_skellam_rdp_at_every_order():
    params = SkellamParams.calibrate(
        dim=500, clip_norm=1.0, noise_multiplier=1.2, num_clients=10, min_clients=8, bits=20
    )
    z = params.noise_multiplier_for(8)
    assert z == pytest.approx(1.2, rel=1e-9)
    mu = 8 * params.local_variance
    d2 = params.norm_bound
    d1 = min(math.sqrt(params.padded_dim) * d2, d2**2)
    for alpha in [1.5, 2, 8, 32, 256, 4096]:
        skellam = alpha * d2**2 / (2 * mu) + min(
            ((2 * alpha - 1) * d2**2 + 6 * d1) / (4 * mu**2), 3 * d1 / (2 * mu)
        )
        assert alpha / (2 * z**2) >= skellam
    assert params.noise_multiplier_for(10) > z  # more survivors, more noise
    assert params.noise_multiplier_for(8, "replace_one") == pytest.approx(z, rel=1e-6)


def test_decoding_refuses_too_few_noise_shares_and_params_are_validated():
    params = SkellamParams.calibrate(
        dim=16, clip_norm=1.0, noise_multiplier=1.0, num_clients=10, min_clients=6, bits=16
    )
    encoder = SkellamEncoder(params, rotation_seed=1)
    with pytest.raises(ValueError, match="min_clients"):
        encoder.decode(np.zeros(16, np.uint32), 5)
    with pytest.raises(ValueError, match="bits"):
        SkellamParams.calibrate(
            dim=16, clip_norm=1.0, noise_multiplier=1.0, num_clients=10, bits=24
        )
    with pytest.raises(ValueError, match="modulus too small"):
        SkellamParams.calibrate(
            dim=2**16, clip_norm=1.0, noise_multiplier=1.0, num_clients=1000, bits=10
        )
    assert SkellamParams.from_dict(params.to_dict()) == params


def test_encoder_refuses_an_update_above_the_clip_instead_of_encoding_it():
    params = SkellamParams.calibrate(
        dim=64, clip_norm=1.0, noise_multiplier=1.0, num_clients=10, min_clients=6, bits=16
    )
    encoder = SkellamEncoder(params, rotation_seed=3)
    unclipped = np.full(64, 1.0, np.float32)  # norm 8: the noise is calibrated for 1
    with pytest.raises(ValueError, match="exceeds clip_norm"):
        encoder.encode(unclipped)
    just_above = np.zeros(64, np.float32)
    just_above[0] = np.nextafter(np.float32(1.0), np.float32(2.0))
    with pytest.raises(ValueError, match="exceeds clip_norm"):
        encoder.encode(just_above)
    clipped = clip_l2(unclipped, 1.0)
    assert encoder.encode(clipped).shape == (params.padded_dim,)
