"""Subsampled RDP bounds that hold for ANY base mechanism, given only its RDP curve.

The Gaussian-specific analyses in Opacus and dp-accounting use the exact shape of a
Gaussian's privacy loss; a mechanism that is merely *dominated in RDP* by a Gaussian
(distributed Skellam, see skellam.py) needs a bound that uses the curve alone.
All functions take `curve(orders) -> eps(orders)`, the base mechanism's RDP at each
order (valid without sampling), and return the sampled mechanism's RDP per order.
Everything is in log-space (logsumexp, gammaln): orders go up to 1024.

- `poisson_mixture_rdp`: Poisson sampling when the mechanism's noise depends on who
  was sampled (distributed DP: a sampled client adds its own noise share). Sound for
  every real order > 1; only linear in q. See its docstring for why Zhu and Wang's
  quadratic bound does not apply there.
- `poisson_general_rdp`: Zhu and Wang 2019, Theorem 6 (general upper bound). Valid when
  the target's absence leaves the rest of the mechanism unchanged (central noise);
  kept as the reference the tests measure distributed DP against.
- `without_replacement_general_rdp`: Wang, Balle and Kasiviswanathan 2019, Theorem 9
  (general bound, replace-one, fixed-size sampling without replacement).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import gammaln, logsumexp

Curve = Callable[[np.ndarray], np.ndarray]

# Integer orders only: Agarwal, Kairouz and Liu prove the Skellam RDP bound (skellam.py)
# for integer alpha > 1, the orders TFF's distributed-DP accounting uses (2-128, 256);
# 512 and 1024 as well, for very small epsilons. The general sampling bounds below are
# themselves stated for integer orders (the mixture bound holds for every real one).
INTEGER_ORDERS: tuple[float, ...] = (*range(2, 129), 256, 512, 1024)
# dp-accounting's default grid, with fractional orders 1.1-10.9 where the Skellam bound is
# not proven: only to recompute ledgers that name the legacy accountant 'skellam_rdp'.
LEGACY_FRACTIONAL_ORDERS: tuple[float, ...] = (
    *(1 + x / 10 for x in range(1, 100)),
    *range(11, 64),
    128,
    256,
    512,
    1024,
)
DEFAULT_ORDERS = INTEGER_ORDERS


def gaussian_curve(noise_multiplier: float) -> Curve:
    """RDP of the Gaussian mechanism with noise std / sensitivity = z: alpha / (2 z^2)."""
    z = float(noise_multiplier)
    return lambda orders: np.asarray(orders, dtype=np.float64) / (2 * z * z)


def poisson_mixture_rdp(curve: Curve, q: float, orders: np.ndarray) -> np.ndarray:
    """RDP of a Poisson-sampled mechanism whose noise depends on the sampled set.

    Under distributed DP a sampled client adds its own noise share, so the released
    sum's noise VARIANCE reveals whether the target was sampled (in d dimensions the
    norm of the noise tells variances n and n+1 apart once d >> n^2). Zhu and Wang's
    quadratic-in-q amplification assumes the not-sampled branch is comparable with the
    sampled one through the base curve, which a change of variance is not; it
    underestimates here (tests/privacy/dp/test_dp_soundness.py measures it).

    What holds, for any real alpha > 1, by joint convexity of E_Q[(P/Q)^alpha] over the
    mixture on "target sampled" (b ~ Bernoulli(q), independent of the data): with zero-out
    or replace-one neighbours both worlds share the not-sampled branch, so
        (alpha - 1) eps'(alpha) <= log(1 - q + q exp((alpha - 1) eps(alpha))).
    It is exact when the output reveals b, which is the high-dimensional regime.
    """
    orders = _orders(orders)
    eps = np.asarray(curve(orders), dtype=np.float64)
    if q >= 1.0:
        return eps
    _check_rate(q)
    log_moment = np.logaddexp(np.log1p(-q), np.log(q) + (orders - 1) * eps)
    return log_moment / (orders - 1)


def poisson_general_rdp(curve: Curve, q: float, orders: np.ndarray) -> np.ndarray:
    """Zhu and Wang 2019 ("Poisson subsampled Renyi differential privacy", ICML), Thm 6.

    For integer alpha >= 2 and any mechanism with RDP curve eps (add/remove, or zero-out
    where the zeroed record changes nothing else in the mechanism):
        (alpha - 1) eps'(alpha) <= log( (1-q)^(alpha-1) (alpha q - q + 1)
            + C(alpha, 2) q^2 (1-q)^(alpha-2) e^{eps(2)}
            + 3 sum_{l=3}^{alpha} C(alpha, l) (1-q)^(alpha-l) q^l e^{(l-1) eps(l)} ).
    The result is the minimum with `poisson_mixture_rdp` (also valid here, and the only
    bound at non-integer orders; it keeps the result at most the base curve, which the
    factor 3 would exceed at large q).
    NOT sound for distributed DP under Poisson sampling: see `poisson_mixture_rdp`.
    """
    orders = _orders(orders)
    if q >= 1.0:
        return np.asarray(curve(orders), dtype=np.float64)
    _check_rate(q)
    log_q, log_1mq = np.log(q), np.log1p(-q)

    def log_moment(alpha: int) -> float:
        ls = np.arange(2, alpha + 1)
        eps = np.asarray(curve(ls.astype(np.float64)), dtype=np.float64)
        terms = _log_comb(alpha, ls) + ls * log_q + (alpha - ls) * log_1mq + (ls - 1) * eps
        terms[1:] += np.log(3.0)  # l >= 3
        head = (alpha - 1) * log_1mq + np.log1p((alpha - 1) * q)
        return float(logsumexp(np.concatenate(([head], terms))))

    return np.minimum(_per_integer_order(orders, log_moment), poisson_mixture_rdp(curve, q, orders))


def without_replacement_general_rdp(curve: Curve, q: float, orders: np.ndarray) -> np.ndarray:
    """Wang, Balle and Kasiviswanathan 2019 ("Subsampled Renyi DP and analytical moments
    accountant", AISTATS), Theorem 9: the general bound for sampling m of n without
    replacement (q = m/n) under replace-one, for integer alpha >= 2:
        (alpha - 1) eps'(alpha) <= log( 1 + q^2 C(alpha, 2) min{4 (e^{eps(2)} - 1),
            e^{eps(2)} min{2, (e^{eps(inf)} - 1)^2}}
            + sum_{j=3}^{alpha} q^j C(alpha, j) e^{(j-1) eps(j)} min{2, (e^{eps(inf)} - 1)^j} ).
    eps(inf) is taken as inf (no pure-DP bound assumed), so both inner minima are 2.
    dp-accounting's `SampledWithoutReplacementDpEvent` adds a Gaussian-only term
    (forward differences of the Gaussian CGF, WBK19 Thm 27) and is not used for Skellam.
    Every cohort has m members, so the noise variance is the same in both worlds.
    The result is the minimum with `poisson_mixture_rdp`'s joint-convexity bound, which
    holds here too (the not-sampled branch is shared by both worlds) and covers the
    non-integer orders and large q, where the general bound exceeds the base curve.
    """
    orders = _orders(orders)
    if q >= 1.0:
        return np.asarray(curve(orders), dtype=np.float64)
    _check_rate(q)
    log_q = np.log(q)
    eps2 = float(np.asarray(curve(np.array([2.0])))[0])
    # min{4 (e^eps2 - 1), 2 e^eps2} in log-space
    second = min(np.log(4.0) + eps2 + np.log(-np.expm1(-eps2)), np.log(2.0) + eps2)

    def log_moment(alpha: int) -> float:
        js = np.arange(3, alpha + 1)
        eps = np.asarray(curve(js.astype(np.float64)), dtype=np.float64)
        higher = np.log(2.0) + js * log_q + _log_comb(alpha, js) + (js - 1) * eps
        two = 2 * log_q + _log_comb(alpha, np.array([2]))[0] + second
        return float(logsumexp(np.concatenate(([0.0, two], higher))))

    return np.minimum(_per_integer_order(orders, log_moment), poisson_mixture_rdp(curve, q, orders))


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """(epsilon, delta) from an RDP curve (dp-accounting's conversion, Balle et al. 2020)."""
    from dp_accounting.rdp import rdp_privacy_accountant

    epsilon, _ = rdp_privacy_accountant.compute_epsilon(
        np.asarray(orders, dtype=np.float64), np.asarray(rdp, dtype=np.float64), delta
    )
    return float(epsilon)


def _per_integer_order(orders: np.ndarray, log_moment: Callable[[int], float]) -> np.ndarray:
    out = np.full(orders.shape, np.inf)
    for i, alpha in enumerate(orders):
        if alpha >= 2 and float(alpha).is_integer():
            out[i] = log_moment(int(alpha)) / (alpha - 1)
    return out


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def _orders(orders: np.ndarray) -> np.ndarray:
    orders = np.asarray(orders, dtype=np.float64)
    if orders.ndim != 1 or not np.all(orders > 1):
        raise ValueError(f"orders={orders!r} is invalid; allowed: a 1-D array of orders > 1")
    return orders


def _check_rate(q: float) -> None:
    if not 0 < q <= 1:
        raise ValueError(f"q={q!r} is invalid; allowed: (0, 1]")
