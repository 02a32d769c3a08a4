"""Distributed DP with the Skellam mechanism (Agarwal, Kairouz, Liu 2021).

Client:  (an update already clipped to C, checked) -> randomized Hadamard rotation -> scale
by s -> conditional randomized rounding to integers -> + Skellam(mu_local) noise share ->
reduce mod 2**bits.
Server:  secure aggregation sums mod 2**bits; `decode` maps back to signed integers,
unscales and unrotates. Sums of Skellam shares are Skellam, so the server only ever
sees the sum already carrying noise of variance n * mu_local.

Accounting (Gaussian equivalent). Agarwal et al. (Thm 3.5; mu = total variance,
integer sensitivities D1, D2) give, for integer alpha > 1,
    eps(alpha) <= alpha D2^2/(2 mu) + min(((2 alpha - 1) D2^2 + 6 D1)/(4 mu^2), 3 D1/(2 mu)).
Because (2 alpha - 1) D2^2 + 6 D1 <= alpha (2 D2^2 + 6 D1) for alpha >= 1, this is at
most alpha / (2 z^2) with
    1/z^2 = D2^2/mu + (D2^2 + 3 D1)/mu^2,
i.e. the RDP curve of a Gaussian with noise multiplier z at EVERY order. Only that
curve is known, so the sole sound accountant is 'skellam_rdp_integer' (accounting.py):
the curve, amplified under sampling by bounds valid for any mechanism (subsampled_rdp.py),
at integer orders only, those the bound is proven for (Agarwal et al. state it for
integer alpha; TFF's accounting evaluates integer orders). Ledgers from before name
'skellam_rdp', the same at fractional orders too, and are recomputed with it.
Adjacency is zero-out or replace-one: under add/remove the target's noise share would
leave with it (a change of variance, which no shift-based bound covers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedveil.protocol.dp_rules import ADD_REMOVE, NEIGHBOURING_RELATIONS, REPLACE_ONE

from .clipping import check_l2_bound
from .hadamard import padded_dimension, rotate, unrotate
from .rng import resolve_generator
from .vectors import as_vector

DEFAULT_BETA = math.exp(-0.5)  # conditional rounding: each try passes w.p. >= 1 - beta
DEFAULT_WRAP_SIGMAS = 3.9  # per-coordinate wrap probability ~1e-4 (Gaussian tail)
MAX_BITS = 22  # sums stay exact in float32 (24-bit mantissa) downstream
MAX_ROUNDING_TRIES = 1000


@dataclass(frozen=True)
class SkellamParams:
    """Run-constant parameters, computed once on the server and sent to clients."""

    dim: int
    clip_norm: float
    noise_multiplier: float  # target Gaussian-equivalent z at `min_clients` survivors
    num_clients: int  # planned cohort: sizes the modulus
    min_clients: int  # fewest survivors a round may decode: sizes the noise shares
    bits: int
    scale: float  # s: real units -> integer grid
    norm_bound: float  # B: L2 bound of a client's rounded, scaled vector
    local_variance: float  # mu_local: Skellam variance each client adds per coordinate
    beta: float = DEFAULT_BETA
    wrap_sigmas: float = DEFAULT_WRAP_SIGMAS

    @property
    def padded_dim(self) -> int:
        return padded_dimension(self.dim)

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    @classmethod
    def calibrate(
        cls,
        *,
        dim: int,
        clip_norm: float,
        noise_multiplier: float,
        num_clients: int,
        min_clients: int | None = None,
        bits: int = 20,
        beta: float = DEFAULT_BETA,
        wrap_sigmas: float = DEFAULT_WRAP_SIGMAS,
    ) -> SkellamParams:
        """Choose the scale s (largest that avoids wrap-around) and the noise shares."""
        min_clients = num_clients if min_clients is None else min_clients
        _validate(
            dim, clip_norm, noise_multiplier, num_clients, min_clients, bits, beta, wrap_sigmas
        )
        padded = padded_dimension(dim)
        modulus = 1 << bits
        # Worst case: all client vectors aligned, so the rotated sum has coordinate
        # std n*B/sqrt(d); the noise adds n_max * mu_local. Solve for B, then for s.
        headroom = 1.0
        for _ in range(50):
            spread = math.sqrt(
                num_clients**2 / padded + noise_multiplier**2 * num_clients / min_clients
            )
            target_bound = headroom * modulus / (2 * wrap_sigmas * spread)
            scale = _scale_for_bound(target_bound, clip_norm, padded, beta)
            bound = rounded_norm_bound(scale * clip_norm, padded, beta)
            total_variance = _variance_for(noise_multiplier, bound, _l1_bound(bound, padded))
            local_variance = total_variance / min_clients
            needed = (
                2
                * wrap_sigmas
                * math.sqrt((num_clients * bound) ** 2 / padded + num_clients * local_variance)
            )
            if needed <= modulus:
                return cls(
                    dim,
                    float(clip_norm),
                    float(noise_multiplier),
                    num_clients,
                    min_clients,
                    bits,
                    scale,
                    bound,
                    local_variance,
                    beta,
                    wrap_sigmas,
                )
            headroom *= 0.999 * modulus / needed
        raise ValueError("could not size the Skellam scale; increase bits")

    def noise_multiplier_for(self, num_aggregated: int, neighbouring: str = ADD_REMOVE) -> float:
        """Gaussian-equivalent z of the decoded sum of `num_aggregated` clients.

        Relative to one client's contribution bound B (the convention of
        `PrivacyEvent`). Fewer survivors means less noise, so account with this.
        """
        if neighbouring not in NEIGHBOURING_RELATIONS:
            raise ValueError(
                f"neighbouring={neighbouring!r} is invalid; allowed: {NEIGHBOURING_RELATIONS}"
            )
        if not isinstance(num_aggregated, int) or num_aggregated < 1:
            raise ValueError(f"num_aggregated={num_aggregated!r} is invalid; allowed: >= 1")
        total_variance = num_aggregated * self.local_variance
        # Replace-one moves the output by up to 2B (and 2 D1); the accountant then
        # halves z, so report twice the z computed at the doubled sensitivities.
        factor = 2 if neighbouring == REPLACE_ONE else 1
        d2 = factor * self.norm_bound
        d1 = factor * _l1_bound(self.norm_bound, self.padded_dim)
        return factor * _gaussian_equivalent(total_variance, d2, d1)

    def noise_stddev_for(self, num_aggregated: int) -> float:
        """Std per coordinate of the decoded sum's noise, in the update's units."""
        return math.sqrt(num_aggregated * self.local_variance) / self.scale

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SkellamParams:
        return cls(**data)


class SkellamEncoder:
    """Per-round encoder: `encode` on each client, `decode` on the server."""

    def __init__(
        self,
        params: SkellamParams,
        rotation_seed: int,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.params = params
        self.rotation_seed = int(rotation_seed)
        self._rng = rng  # None: a CSPRNG-seeded generator per encode

    def encode(self, update: Any) -> np.ndarray:
        """Client side: the rotated, rounded, noised update in Z_{2**bits} (uint32).

        `update` must already be clipped to `clip_norm` (the client runtime clips once,
        with privacy.dp.clipping): an update above it is refused, never encoded, because
        the noise is calibrated to that sensitivity.
        """
        p = self.params
        vector = as_vector(update, np.float64)
        if vector.shape[0] != p.dim:
            raise ValueError(f"update has dimension {vector.shape[0]}, expected {p.dim}")
        check_l2_bound(vector, p.clip_norm)
        rng = resolve_generator(self._rng)
        scaled = rotate(vector, self.rotation_seed) * p.scale
        rounded = _conditional_round(scaled, p.norm_bound, rng)
        noise = skellam_noise(p.local_variance, rounded.shape[0], rng)
        return np.mod(rounded + noise, p.modulus).astype(np.uint32)

    def decode(self, aggregate: Any, num_aggregated: int) -> np.ndarray:
        """Server side: modular sum of `num_aggregated` encodings -> noised float32 sum."""
        p = self.params
        if num_aggregated < p.min_clients:
            # Fewer noise shares than calibrated for: releasing would overspend privacy.
            raise ValueError(
                f"num_aggregated={num_aggregated!r} is below min_clients="
                f"{p.min_clients}; the sum carries too little noise to release"
            )
        if num_aggregated > p.num_clients:
            raise ValueError(
                f"num_aggregated={num_aggregated!r} exceeds num_clients="
                f"{p.num_clients} the modulus was sized for"
            )
        total = np.asarray(aggregate).astype(np.int64).reshape(-1)
        if total.shape[0] != p.padded_dim:
            raise ValueError(f"aggregate has length {total.shape[0]}, expected {p.padded_dim}")
        signed = np.mod(total, p.modulus)
        signed[signed >= p.modulus // 2] -= p.modulus
        return unrotate(signed.astype(np.float64) / p.scale, self.rotation_seed, p.dim).astype(
            np.float32
        )


def skellam_noise(variance: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Symmetric Skellam: Poisson(v/2) - Poisson(v/2), variance v, closed under sums."""
    half = variance / 2
    return rng.poisson(half, size).astype(np.int64) - rng.poisson(half, size).astype(np.int64)


def rounded_norm_bound(scaled_norm: float, padded_dim: int, beta: float = DEFAULT_BETA) -> float:
    """L2 bound after conditional randomized rounding (Kairouz et al. 2021, Thm 2)."""
    root_d = math.sqrt(padded_dim)
    tail = math.sqrt(2 * math.log(1 / beta))
    squared = scaled_norm**2 + padded_dim / 4 + tail * (scaled_norm + root_d / 2)
    return min(math.sqrt(squared), scaled_norm + root_d)


def _conditional_round(scaled: np.ndarray, bound: float, rng: np.random.Generator) -> np.ndarray:
    # Unbiased randomized rounding, retried until the norm bound the accountant
    # assumes holds: the bound is a hard sensitivity, not a high-probability one.
    floor = np.floor(scaled)
    fraction = scaled - floor
    for _ in range(MAX_ROUNDING_TRIES):
        rounded = (floor + (rng.random(scaled.shape[0]) < fraction)).astype(np.int64)
        if np.linalg.norm(rounded.astype(np.float64)) <= bound:
            return rounded
    raise RuntimeError("conditional rounding failed repeatedly; the norm bound is inconsistent")


def _l1_bound(l2_bound: float, padded_dim: int) -> float:
    # Integer vectors: |x_i| <= x_i^2, so ||x||_1 <= ||x||_2^2; also <= sqrt(d)||x||_2.
    return min(math.sqrt(padded_dim) * l2_bound, l2_bound**2)


def _gaussian_equivalent(total_variance: float, d2: float, d1: float) -> float:
    return (d2**2 / total_variance + (d2**2 + 3 * d1) / total_variance**2) ** -0.5


def _variance_for(noise_multiplier: float, d2: float, d1: float) -> float:
    # Smallest total variance mu whose Gaussian equivalent reaches z: solve
    # (d2^2 + 3 d1) * u^2 + d2^2 * u - 1/z^2 = 0 for u = 1/mu.
    # Written as 2c / (b + sqrt(b^2 + 4ac)) to avoid cancellation when a*c << b^2.
    a = d2**2 + 3 * d1
    b = d2**2
    c = 1 / noise_multiplier**2
    u = 2 * c / (b + math.sqrt(b * b + 4 * a * c))
    return 1 / u


def _scale_for_bound(target_bound: float, clip_norm: float, padded_dim: int, beta: float) -> float:
    # rounded_norm_bound is increasing in s: bisect for the largest s under target.
    if rounded_norm_bound(0.0, padded_dim, beta) >= target_bound:
        raise ValueError(
            f"modulus too small: rounding alone needs a bound of "
            f"{rounded_norm_bound(0.0, padded_dim, beta):.1f} > {target_bound:.1f}; "
            "increase bits or lower the cohort size"
        )
    low, high = 0.0, target_bound / clip_norm
    for _ in range(200):
        mid = (low + high) / 2
        if rounded_norm_bound(mid * clip_norm, padded_dim, beta) <= target_bound:
            low = mid
        else:
            high = mid
    return low


def _validate(
    dim: int,
    clip_norm: float,
    noise_multiplier: float,
    num_clients: int,
    min_clients: int,
    bits: int,
    beta: float,
    wrap_sigmas: float,
) -> None:
    checks = [
        (isinstance(dim, int) and dim >= 1, "dim", dim, "an integer >= 1"),
        (clip_norm > 0 and math.isfinite(clip_norm), "clip_norm", clip_norm, "> 0"),
        (
            noise_multiplier > 0 and math.isfinite(noise_multiplier),
            "noise_multiplier",
            noise_multiplier,
            "> 0",
        ),
        (isinstance(num_clients, int) and num_clients >= 1, "num_clients", num_clients, ">= 1"),
        (
            isinstance(min_clients, int) and 1 <= min_clients <= num_clients,
            "min_clients",
            min_clients,
            f"[1, num_clients={num_clients}]",
        ),
        (
            isinstance(bits, int) and math.log2(max(num_clients, 2)) <= bits <= MAX_BITS,
            "bits",
            bits,
            f"[log2(num_clients)={math.log2(max(num_clients, 2)):.1f}, {MAX_BITS}]",
        ),
        (0 < beta < 1, "beta", beta, "(0, 1)"),
        (wrap_sigmas > 0, "wrap_sigmas", wrap_sigmas, "> 0"),
    ]
    for ok, field, value, allowed in checks:
        if not ok:
            raise ValueError(f"SkellamParams.{field}={value!r} is invalid; allowed: {allowed}")
