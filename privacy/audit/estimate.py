"""One-shot empirical epsilon (Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar,
"One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024).

The auditor inserts canaries (random unit updates) and keeps as many held-out ones that
never take part. After training, the cosines of the released delta(s) with the inserted
canaries and with the held-out canaries are two samples. Fitting a Gaussian to each, the
estimate is the epsilon at the run's delta of the two-Gaussian hypothesis test between
them: the smallest eps with H_eps(P || Q) <= delta both ways, where
H_eps(P || Q) = sup_S P(S) - e^eps Q(S) is the hockey-stick divergence.

The headline estimate uses one sigma for both (the held-out canaries', i.e. the null
distribution's): the Gaussian mechanism's epsilon at mu = |mu_in - mu_out| / sigma_out.
At delta = 1e-5 the unequal-variance epsilon is dominated by the far tails, where a few
percent of sampling error in two fitted sigmas reads as several units of epsilon even
when nothing leaks; it is reported beside the estimate (`epsilon_unequal_variance`), not
as it. The interval is a percentile bootstrap over the canaries.

An estimate, not a bound: it assumes Gaussian scores and an adversary that uses cosines.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

EPS_MAX = 100.0  # beyond this the Gaussians are practically disjoint


def hockey_stick(mu_p: float, sigma_p: float, mu_q: float, sigma_q: float, epsilon: float) -> float:
    """H_eps(P || Q) = P(S) - e^eps Q(S) for S = {x : log p(x) - log q(x) > eps}, exactly
    (S is where a quadratic in x is positive: an interval, a half-line or two tails)."""
    if sigma_p <= 0 or sigma_q <= 0:
        raise ValueError(f"sigma_p = {sigma_p}, sigma_q = {sigma_q}: must be > 0")
    a = 1 / (2 * sigma_q**2) - 1 / (2 * sigma_p**2)
    b = mu_p / sigma_p**2 - mu_q / sigma_q**2
    c = mu_q**2 / (2 * sigma_q**2) - mu_p**2 / (2 * sigma_p**2) + math.log(sigma_q / sigma_p)
    c -= epsilon
    pieces = _positive_set(a, b, c)
    p_mass = sum(_mass(lo, hi, mu_p, sigma_p) for lo, hi in pieces)
    q_mass = sum(_mass(lo, hi, mu_q, sigma_q) for lo, hi in pieces)
    return max(0.0, p_mass - math.exp(epsilon) * q_mass)


def _positive_set(a: float, b: float, c: float) -> list[tuple[float, float]]:
    """{x : a x^2 + b x + c > 0} as a list of intervals."""
    inf = math.inf
    scale = max(abs(b), abs(c), 1.0)
    if abs(a) <= 1e-12 * scale:  # equal variances: a half-line
        if b > 0:
            return [(-c / b, inf)]
        if b < 0:
            return [(-inf, -c / b)]
        return [(-inf, inf)] if c > 0 else []
    disc = b * b - 4 * a * c
    if disc <= 0:
        return [(-inf, inf)] if a > 0 else []
    r1, r2 = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
    return [(-inf, r1), (r2, inf)] if a > 0 else [(r1, r2)]


def _mass(lo: float, hi: float, mu: float, sigma: float) -> float:
    # sf for upper tails and cdf for lower ones: both keep precision far out in the tail.
    if hi == math.inf:
        return _sf((lo - mu) / sigma)
    if lo == -math.inf:
        return _sf((mu - hi) / sigma)
    return max(0.0, _sf((lo - mu) / sigma) - _sf((hi - mu) / sigma))


def _sf(z: float) -> float:
    """The standard normal's upper tail (erfc: exact far out, and fast in the bootstrap)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def gaussian_pair_epsilon(
    mu_in: float, sigma_in: float, mu_out: float, sigma_out: float, delta: float
) -> float:
    """The epsilon at `delta` of the two-Gaussian test: the smallest eps >= 0 with
    H_eps(P||Q) <= delta and H_eps(Q||P) <= delta (bisection; H_eps falls with eps)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta = {delta}: must be in (0, 1)")
    worst = 0.0
    for p, q in (
        ((mu_in, sigma_in), (mu_out, sigma_out)),
        ((mu_out, sigma_out), (mu_in, sigma_in)),
    ):
        if hockey_stick(*p, *q, 0.0) <= delta:
            continue
        lo, hi = 0.0, EPS_MAX
        if hockey_stick(*p, *q, hi) > delta:
            return EPS_MAX
        for _ in range(60):
            mid = (lo + hi) / 2
            if hockey_stick(*p, *q, mid) > delta:
                lo = mid
            else:
                hi = mid
        worst = max(worst, hi)
    return worst


@dataclass(frozen=True)
class EmpiricalEstimate:
    """The estimate, its bootstrap interval and the fitted Gaussians."""

    epsilon: float
    interval: tuple[float, float]
    confidence: float
    mu_in: float
    sigma_in: float
    mu_out: float
    sigma_out: float
    inserted: int
    held_out: int
    epsilon_unequal_variance: float

    def to_json(self) -> dict[str, object]:
        return {
            "epsilon": self.epsilon,
            "interval": list(self.interval),
            "confidence": self.confidence,
            "epsilon_unequal_variance": self.epsilon_unequal_variance,
            "fit": {
                "inserted": {"mean": self.mu_in, "std": self.sigma_in, "count": self.inserted},
                "held_out": {"mean": self.mu_out, "std": self.sigma_out, "count": self.held_out},
            },
        }


def _fit(scores: np.ndarray) -> tuple[float, float]:
    # A floor on sigma: identical scores (e.g. all zero) would make the fit degenerate.
    return float(np.mean(scores)), max(float(np.std(scores, ddof=1)), 1e-12)


def estimate_epsilon(
    inserted: np.ndarray,
    held_out: np.ndarray,
    delta: float,
    *,
    confidence: float = 0.95,
    resamples: int = 200,
    seed: int = 0,
) -> EmpiricalEstimate:
    """The one-shot estimate from the inserted and held-out canaries' scores, with a
    percentile bootstrap interval (`resamples` resamples of both samples)."""
    inserted, held_out = np.asarray(inserted, float), np.asarray(held_out, float)
    for name, arr in (("inserted", inserted), ("held_out", held_out)):
        if arr.size < 2:
            raise ValueError(f"{name} canaries: {arr.size} scores; need at least 2")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: must be in (0, 1)")
    mu_in, s_in = _fit(inserted)
    mu_out, s_out = _fit(held_out)
    point = _equal_variance_epsilon(mu_in, mu_out, s_out, delta)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(resamples):
        a_mu, _ = _fit(rng.choice(inserted, inserted.size))
        b_mu, b_sigma = _fit(rng.choice(held_out, held_out.size))
        boots.append(_equal_variance_epsilon(a_mu, b_mu, b_sigma, delta))
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(boots, [tail, 100 - tail]) if boots else (point, point)
    return EmpiricalEstimate(
        point,
        (float(lo), float(hi)),
        confidence,
        mu_in,
        s_in,
        mu_out,
        s_out,
        int(inserted.size),
        int(held_out.size),
        gaussian_pair_epsilon(mu_in, s_in, mu_out, s_out, delta),
    )


def _equal_variance_epsilon(mu_in: float, mu_out: float, sigma: float, delta: float) -> float:
    """`gaussian_pair_epsilon(mu_in, sigma, mu_out, sigma, delta)`, bit for bit, in a
    fraction of the time: the bootstrap calls it hundreds of times, each a 60-step
    bisection of `hockey_stick`, whose general case (intervals, two tails) it skips."""
    if not 0 < delta < 1:
        raise ValueError(f"delta = {delta}: must be in (0, 1)")
    if sigma <= 0:
        raise ValueError(f"sigma_p = {sigma}, sigma_q = {sigma}: must be > 0")
    worst = 0.0
    for mu_p, mu_q in ((mu_in, mu_out), (mu_out, mu_in)):
        h = _equal_hockey_stick(mu_p, mu_q, sigma)
        if h(0.0) <= delta:
            continue
        lo, hi = 0.0, EPS_MAX
        if h(hi) > delta:
            return EPS_MAX
        for _ in range(60):
            mid = (lo + hi) / 2
            if h(mid) > delta:
                lo = mid
            else:
                hi = mid
        worst = max(worst, hi)
    return worst


def _equal_hockey_stick(mu_p: float, mu_q: float, sigma: float) -> Callable[[float], float]:
    """eps -> hockey_stick(mu_p, sigma, mu_q, sigma, eps), with the same floating-point
    operations in the same order (equal sigmas: the quadratic's a is exactly 0, so the set
    is a half-line, or everything, or nothing)."""
    s2 = sigma**2
    b = mu_p / s2 - mu_q / s2
    c0 = mu_q**2 / (2 * s2) - mu_p**2 / (2 * s2) + math.log(sigma / sigma)
    root2 = math.sqrt(2)

    def h(epsilon: float) -> float:
        c = c0 - epsilon
        if b > 0:
            cut = -c / b
            p_mass = 0.5 * math.erfc((cut - mu_p) / sigma / root2)
            q_mass = 0.5 * math.erfc((cut - mu_q) / sigma / root2)
        elif b < 0:
            cut = -c / b
            p_mass = 0.5 * math.erfc((mu_p - cut) / sigma / root2)
            q_mass = 0.5 * math.erfc((mu_q - cut) / sigma / root2)
        elif c > 0:
            p_mass = q_mass = 0.5 * math.erfc(-math.inf / root2)
        else:
            return 0.0
        return max(0.0, p_mass - math.exp(epsilon) * q_mass)

    return h
