"""Choosing the banded and BLT coefficients: a small optimisation of the expected error.

Objective (scale-free, so the noise multiplier does not enter): the mean over rounds
of the squared prefix-sum noise, sum_t ||B_t||^2 / T, times sensitivity^2 under the
schema; at equal epsilon this is the mean squared error of the released prefix sums.

- banded: start from the band-truncated square root of A (Toeplitz coefficients
  binom(2j, j) / 4^j, Fichtenberger et al. 2023; Kalinin and Lampert 2024's "banded
  square root"), then L-BFGS on the band's coefficients (c_0 fixed at 1: the objective
  is scale-free). The result is never worse than the closed-form start.
- BLT: `buffers` pairs (omega, theta), theta = sigmoid, omega = sigmoid / buffers so
  that sum(omega) <= 1 (non-increasing coefficients, where the every-b pattern is the
  worst case); L-BFGS from a few deterministic starts, the best kept.

Both use torch autograd on T x T matrices (T up to a few thousand); the coefficients
are public and deterministic (no randomness: nothing here is secret).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .factorizations import BandedFactorization, BltFactorization
from .schema import ParticipationSchema

MAX_OPTIMISED_ROUNDS = 4096
DEFAULT_BLT_BUFFERS = 3


def sqrt_coefficients(band: int) -> np.ndarray:
    """The first `band` Toeplitz coefficients of A^(1/2): binom(2j, j) / 4^j."""
    c = np.ones(band)
    for j in range(1, band):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c


def banded_factorization(
    rounds: int, schema: ParticipationSchema, band: int | None = None, *, iterations: int = 60
) -> BandedFactorization:
    """Banded Toeplitz C for `rounds` under `schema`: band = min_separation by default."""
    _check_size(rounds)
    if band is None:
        band = min(rounds, schema.separation(rounds), 64)
    if not (1 <= band <= rounds):
        raise ValueError(f"dp.ftrl.band={band!r} is invalid; allowed: [1, rounds={rounds}]")
    start = sqrt_coefficients(band)
    if band == 1:
        return BandedFactorization(rounds, (1.0,))
    import torch

    free = torch.tensor(start[1:], dtype=torch.float64, requires_grad=True)
    a = torch.tril(torch.ones(rounds, rounds, dtype=torch.float64))
    lag = torch.arange(rounds)[:, None] - torch.arange(rounds)[None, :]

    def objective() -> torch.Tensor:
        c = torch.cat([torch.ones(1, dtype=torch.float64), free])
        padded = torch.cat([c, torch.zeros(rounds, dtype=torch.float64)])
        matrix = torch.where(lag >= 0, padded[lag.clamp(min=0, max=band)], 0.0)
        matrix = torch.where((lag >= 0) & (lag < band), matrix, 0.0)
        b = torch.linalg.solve_triangular(matrix, a, upper=False, left=False)
        return (b**2).sum() / rounds * (c**2).sum()

    best = _lbfgs(objective, [free], iterations)
    coefficients = np.concatenate([[1.0], free.detach().numpy()])
    closed_form = BandedFactorization(rounds, tuple(float(x) for x in start))
    found = BandedFactorization(rounds, tuple(float(x) for x in coefficients))
    if not math.isfinite(best) or _loss(found, schema) > _loss(closed_form, schema):
        return closed_form
    return found


def blt_factorization(
    rounds: int,
    schema: ParticipationSchema,
    buffers: int = DEFAULT_BLT_BUFFERS,
    *,
    iterations: int = 60,
) -> BltFactorization:
    """BLT C for `rounds` under `schema` (its sensitivity at the every-b pattern)."""
    _check_size(rounds)
    if not (1 <= buffers <= 8):
        raise ValueError(f"dp.ftrl.buffers={buffers!r} is invalid; allowed: [1, 8]")
    import torch

    k = schema.effective_participations(rounds)
    b = schema.separation(rounds)
    a = torch.tril(torch.ones(rounds, rounds, dtype=torch.float64))
    lag = torch.arange(rounds)[:, None] - torch.arange(rounds)[None, :]
    pattern = torch.zeros(rounds, dtype=torch.float64)
    pattern[torch.arange(k) * b] = 1.0
    candidates = []
    for shift in (-2.0, 0.0, 2.0):
        u = torch.linspace(1.0 + shift, 4.0 + shift, buffers, dtype=torch.float64)
        u.requires_grad_(True)
        v = torch.full((buffers,), -1.0, dtype=torch.float64, requires_grad=True)

        def parts(u: torch.Tensor = u, v: torch.Tensor = v) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.sigmoid(v) / buffers, torch.sigmoid(u)

        def objective(
            parts: Callable[[], tuple[torch.Tensor, torch.Tensor]] = parts,
        ) -> torch.Tensor:
            omega, theta = parts()
            j = torch.arange(1, rounds, dtype=torch.float64)
            tail = (omega[:, None] * theta[:, None] ** (j - 1)).sum(dim=0)
            c = torch.cat([torch.ones(1, dtype=torch.float64), tail])
            matrix = torch.where(lag >= 0, c[lag.clamp(min=0)], 0.0)
            decoder = torch.linalg.solve_triangular(matrix, a, upper=False, left=False)
            sensitivity2 = ((matrix @ pattern) ** 2).sum()
            return (decoder**2).sum() / rounds * sensitivity2

        _lbfgs(objective, [u, v], iterations)
        omega, theta = parts()
        candidates.append(
            BltFactorization(
                rounds,
                tuple(float(x) for x in omega.detach().numpy()),
                tuple(float(x) for x in np.minimum(theta.detach().numpy(), 1 - 1e-12)),
            )
        )
    return min(candidates, key=lambda f: _loss(f, schema))


def _loss(
    factorization: BandedFactorization | BltFactorization, schema: ParticipationSchema
) -> float:
    return factorization.prefix_noise_rmse() ** 2 * factorization.sensitivity(schema) ** 2


def _lbfgs(objective: Callable[[], Any], params: list[Any], iterations: int) -> float:
    import torch

    optimizer = torch.optim.LBFGS(
        params, lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(objective())


def _check_size(rounds: int) -> None:
    if not (isinstance(rounds, int) and 1 <= rounds <= MAX_OPTIMISED_ROUNDS):
        raise ValueError(
            f"dp.ftrl rounds={rounds!r} is invalid for an optimised factorisation; "
            f"allowed: [1, {MAX_OPTIMISED_ROUNDS}]"
        )
