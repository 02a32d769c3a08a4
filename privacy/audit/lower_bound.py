"""The one-run epsilon lower bound (Steinke, Nasr and Jagielski, "Privacy Auditing with
One (1) Training Run", NeurIPS 2023): the audit's second, conservative line.

Each of m canaries is included independently with probability 1/2. The auditor makes
the f-DP audit's guesses (`fdp.correct_guesses`: the m // 4 highest scores "included",
the m // 4 lowest "excluded", fixed in advance). For an (eps, delta)-DP mechanism the
number W of correct guesses out of r satisfies (their Theorem 5.2)

    P[W >= v] <= F(v) + 2 m delta max_{i = 1..m} (F(v - i) - F(v)) / i,

with F(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v]. With v correct guesses, every eps
whose right-hand side (at the run's delta) is <= beta is refuted at confidence 1 - beta,
and the lower bound is the largest such eps. The delta term grows with m: with it the
bound cannot reach about 5.5 at 5,000 canaries, whatever the mechanism, which is why
the verdict rests on the f-DP test (`fdp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from fedveil.privacy.audit.fdp import correct_guesses


def steinke_tail(
    epsilon: float, guesses: int, correct: int, canaries: int = 0, delta: float = 0.0
) -> float:
    """The right-hand side of Theorem 5.2: the most P[W >= correct] an (eps, delta)-DP
    mechanism allows with `guesses` guesses on `canaries` canaries."""
    p = 1 / (1 + math.exp(-epsilon))
    f_v = float(binom.sf(correct - 1, guesses, p))
    if delta == 0.0:
        return f_v
    i = np.arange(1, canaries + 1)
    f_shifted = binom.sf(correct - i - 1, guesses, p)  # F(v - i); 1 once v - i <= 0
    return f_v + 2 * canaries * delta * float(np.max((f_shifted - f_v) / i))


def binomial_epsilon_bound(
    guesses: int, correct: int, beta: float = 0.05, *, canaries: int = 0, delta: float = 0.0
) -> float:
    """The largest eps with steinke_tail(eps, ...) <= beta; 0 when even eps = 0 (random
    guessing) explains `correct` at level beta. `delta` > 0 needs `canaries` (m)."""
    if guesses < 0 or not 0 <= correct <= guesses:
        raise ValueError(
            f"correct = {correct} of guesses = {guesses}: need 0 <= correct <= guesses"
        )
    if not 0 < beta < 1:
        raise ValueError(f"beta = {beta}: must be in (0, 1)")
    if not 0 <= delta < 1:
        raise ValueError(f"delta = {delta}: must be in [0, 1)")
    if delta > 0 and canaries < guesses:
        raise ValueError(f"canaries = {canaries}: the delta term needs m >= guesses {guesses}")

    def tail(eps: float) -> float:
        return steinke_tail(eps, guesses, correct, canaries, delta)

    if guesses == 0 or tail(0.0) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while tail(hi) <= beta and hi < 1e3:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if tail(mid) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class LowerBound:
    """The bound and the guesses that gave it."""

    epsilon: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    k_plus: int
    k_minus: int
    delta: float

    def to_json(self) -> dict[str, object]:
        return {
            "method": "Steinke, Nasr, Jagielski 2023 (Theorem 5.2, delta term included)",
            "epsilon": self.epsilon,
            "confidence": self.confidence,
            "canaries": self.canaries,
            "guesses": self.guesses,
            "correct": self.correct,
            "k_plus": self.k_plus,
            "k_minus": self.k_minus,
            "delta_used": self.delta,
        }


def one_run_lower_bound(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    confidence: float = 0.99,
    delta: float = 0.0,
) -> LowerBound:
    """The lower bound at `confidence` from canary `scores` (higher: more likely
    included), the auditor's record of which canaries were `included`, and the run's
    `delta` (0: the pure-DP statement)."""
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = scores.size
    if m < 4 or included.shape != scores.shape:
        raise ValueError(f"{m} canary scores, {included.size} inclusion flags: need >= 4, equal")
    k, correct = correct_guesses(scores, included)
    eps = binomial_epsilon_bound(k, correct, 1 - confidence, canaries=m, delta=delta)
    return LowerBound(eps, confidence, m, k, correct, k // 2, k // 2, delta)
