"""DP-FTRL noise generator: C^-1 xi per release, persisted before release, resume rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedveil.privacy.dp.ftrl import (
    BandedFactorization,
    BltFactorization,
    FtrlNoise,
    IdentityFactorization,
    NoiseStateError,
    TreeFactorization,
)
from fedveil.privacy.dp.ftrl.optimize import sqrt_coefficients

ROUNDS, DIM, SIGMA = 13, 5, 0.7


def _all() -> list:
    return [
        IdentityFactorization(ROUNDS),
        TreeFactorization(ROUNDS),
        BandedFactorization(ROUNDS, tuple(sqrt_coefficients(4))),
        BltFactorization(ROUNDS, (0.3, 0.2), (0.9, 0.5)),
    ]


@pytest.mark.parametrize("factorization", _all(), ids=lambda f: f.kind)
def test_prefix_noise_is_sigma_b_xi(factorization) -> None:
    noise = FtrlNoise(factorization, SIGMA, DIM, None, rng=np.random.default_rng(3))
    w = np.stack([noise.next_noise(t) for t in range(1, ROUNDS + 1)])
    xi = np.random.default_rng(3).standard_normal((ROUNDS, DIM))  # the same draws, in order
    # One xi per release: the tree's nodes are released in its `nodes()` order.
    expected_prefix = SIGMA * factorization.decoder() @ xi
    np.testing.assert_allclose(np.cumsum(w, axis=0), expected_prefix, atol=1e-10)


def test_production_noise_comes_from_the_os_csprng() -> None:
    a = FtrlNoise(TreeFactorization(4), 1.0, 8, None).next_noise(1)
    b = FtrlNoise(TreeFactorization(4), 1.0, 8, None).next_noise(1)
    assert not np.allclose(a, b)


def test_indices_follow_the_ledger_and_t_cannot_grow(tmp_path: Path) -> None:
    noise = FtrlNoise(BandedFactorization(3, (1.0, 0.5)), SIGMA, DIM, tmp_path / "n.npz")
    with pytest.raises(NoiseStateError, match="release index 2 is invalid; allowed: 1"):
        noise.next_noise(2)
    for t in (1, 2, 3):
        noise.next_noise(t)
    with pytest.raises(NoiseStateError, match="extending T is refused"):
        noise.next_noise(4)


@pytest.mark.parametrize("factorization", _all(), ids=lambda f: f.kind)
def test_resume_continues_the_same_correlated_stream(factorization, tmp_path: Path) -> None:
    path = tmp_path / "noise.npz"
    straight = FtrlNoise(factorization, SIGMA, DIM, None, rng=np.random.default_rng(5))
    expected = [straight.next_noise(t) for t in range(1, ROUNDS + 1)]
    rng = np.random.default_rng(5)
    first = FtrlNoise(factorization, SIGMA, DIM, path, rng=rng)
    got = [first.next_noise(t) for t in range(1, 7)]
    assert path.stat().st_mode & 0o777 == 0o600
    resumed = FtrlNoise(factorization, SIGMA, DIM, path, rng=rng)  # the process restarted
    resumed.restore(ledger_releases=6)
    got += [resumed.next_noise(t) for t in range(7, ROUNDS + 1)]
    np.testing.assert_allclose(np.stack(got), np.stack(expected), atol=1e-12)


def test_an_uncharged_draw_is_discarded_and_redrawn_fresh(tmp_path: Path) -> None:
    f = BandedFactorization(ROUNDS, tuple(sqrt_coefficients(4)))
    path = tmp_path / "noise.npz"
    first = FtrlNoise(f, SIGMA, DIM, path)
    drawn = [first.next_noise(t) for t in range(1, 6)]  # release 5 drawn, crash before ledger
    resumed = FtrlNoise(f, SIGMA, DIM, path, rng=np.random.default_rng(9))
    resumed.restore(ledger_releases=4)
    again = resumed.next_noise(5)
    assert not np.allclose(again, drawn[4])  # never the same noise for index 5
    # ... and it is the correlated continuation of releases 1-4 with a fresh xi_5:
    xi5 = np.random.default_rng(9).standard_normal(DIM)
    w = np.stack([*drawn[:4], again]) / SIGMA
    np.testing.assert_allclose((f.encoder()[:5, :5] @ w)[4], xi5, atol=1e-10)


def test_resume_refuses_what_cannot_continue(tmp_path: Path) -> None:
    f = TreeFactorization(ROUNDS)
    path = tmp_path / "noise.npz"
    first = FtrlNoise(f, SIGMA, DIM, path)
    for t in range(1, 6):
        first.next_noise(t)
    with pytest.raises(NoiseStateError, match="at release 5, the ledger at 3"):
        FtrlNoise(f, SIGMA, DIM, path).restore(3)
    with pytest.raises(NoiseStateError, match="another factorisation, T"):
        FtrlNoise(TreeFactorization(ROUNDS + 5), SIGMA, DIM, path).restore(5)
    with pytest.raises(NoiseStateError, match="another factorisation, T, sigma"):
        FtrlNoise(f, SIGMA * 2, DIM, path).restore(5)
    with pytest.raises(NoiseStateError, match="is missing"):
        FtrlNoise(f, SIGMA, DIM, tmp_path / "gone.npz").restore(5)
