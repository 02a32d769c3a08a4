"""Scores of reconstructions: PSNR and SSIM in [0, 1] pixel space, against the
best-matching true image (Hungarian matching for sets), and the baseline a random
training image scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.ndimage import gaussian_filter
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class Match:
    truth: int  # index among the true images
    reconstruction: int
    psnr: float
    ssim: float


def to_pixels(images: torch.Tensor, mean: float, std: float, shape: tuple[int, int]) -> np.ndarray:
    """Normalised images (any leading shape, flat or not) to N x H x W in [0, 1]."""
    flat = images.detach().cpu().double().reshape(-1, shape[0] * shape[1]).numpy()
    return np.clip(flat * std + mean, 0.0, 1.0).reshape(-1, *shape)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return 100.0 if mse <= 1e-10 else 10.0 * float(np.log10(1.0 / mse))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM with a Gaussian window (sigma 1.5), data range 1 (Wang et al. 2004)."""
    c1, c2 = 0.01**2, 0.03**2
    mu_a, mu_b = gaussian_filter(a, 1.5), gaussian_filter(b, 1.5)
    var_a = gaussian_filter(a * a, 1.5) - mu_a**2
    var_b = gaussian_filter(b * b, 1.5) - mu_b**2
    cov = gaussian_filter(a * b, 1.5) - mu_a * mu_b
    num = (2 * mu_a * mu_b + c1) * (2 * cov + c2)
    den = (mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)
    return float(np.mean(num / den))


def match(truth: np.ndarray, recon: np.ndarray) -> list[Match]:
    """Pair each reconstruction with a distinct true image, maximising total PSNR."""
    scores = np.array([[psnr(t, r) for r in recon] for t in truth])
    rows, cols = linear_sum_assignment(-scores)
    return [
        Match(int(i), int(j), float(scores[i, j]), ssim(truth[i], recon[j]))
        for i, j in zip(rows, cols, strict=True)
    ]


def random_baseline(truth: np.ndarray, pool: np.ndarray, seed: int, draws: int = 10) -> float:
    """Mean matched PSNR of as many random training images (from `pool`) as there are
    true images: what an attacker scores knowing only the data distribution, with the
    same best-match advantage the attacks get."""
    rng = np.random.default_rng(seed)
    n = truth.shape[0]
    scores = []
    for _ in range(draws):
        guesses = pool[rng.choice(pool.shape[0], size=n, replace=False)]
        scores.append(np.mean([m.psnr for m in match(truth, guesses)]))
    return float(np.mean(scores))
