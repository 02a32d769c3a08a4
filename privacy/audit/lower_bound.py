"""The one-run epsilon lower bound (Steinke, Nasr and Jagielski, "Privacy Auditing with
One (1) Training Run", NeurIPS 2023).

Each of m canaries is included independently with probability 1/2. The auditor ranks the
canaries by a score fixed in advance and guesses "included" for the k+ highest, "excluded"
for the k- lowest, abstaining on the rest. For an eps-DP mechanism the number W of
correct guesses out of r = k+ + k- is stochastically dominated by Binomial(r, p) with
p = e^eps / (1 + e^eps) (their Theorem 3.1 with delta = 0). So with v correct guesses,
every eps with P[Binomial(r, p(eps)) >= v] <= beta is refuted at confidence 1 - beta, and
the lower bound is the largest such eps.

We use the delta = 0 statement, and the report says so (`delta_used`: 0). For an
(eps, delta) mechanism the paper's bound has an additional delta-dependent term that we
do not add: with the small deltas runs use (1e-5) and m in the thousands it moves the
confidence slightly, not the conclusion.
The auditor tries several (k+, k-) and pays for it with a Bonferroni correction, so the
bound stays valid whichever choice wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom


def binomial_epsilon_bound(guesses: int, correct: int, beta: float = 0.05) -> float:
    """The largest eps with P[Binomial(guesses, e^eps/(1+e^eps)) >= correct] <= beta;
    0 when even eps = 0 (random guessing) explains `correct` at level beta."""
    if guesses < 0 or not 0 <= correct <= guesses:
        raise ValueError(
            f"correct = {correct} of guesses = {guesses}: need 0 <= correct <= guesses"
        )
    if not 0 < beta < 1:
        raise ValueError(f"beta = {beta}: must be in (0, 1)")

    def tail(eps: float) -> float:
        p = 1 / (1 + math.exp(-eps))
        return float(binom.sf(correct - 1, guesses, p))

    if guesses == 0 or tail(0.0) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while tail(hi) <= beta and hi < 1e3:
        lo, hi = hi, hi * 2
    for _ in range(80):
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
    choices_tried: int

    def to_json(self) -> dict[str, object]:
        return {
            "epsilon": self.epsilon,
            "confidence": self.confidence,
            "canaries": self.canaries,
            "guesses": self.guesses,
            "correct": self.correct,
            "k_plus": self.k_plus,
            "k_minus": self.k_minus,
            "choices_tried": self.choices_tried,
            "delta_used": 0.0,
        }


def guess_sizes(m: int) -> list[int]:
    """The guess counts k+ = k- tried: m/2 (guess on every canary), then halving down to
    5. Fixed before looking at scores; the Bonferroni factor is their number."""
    sizes, k = [], m // 2
    while k >= 5:
        sizes.append(k)
        k //= 2
    return sizes or [max(1, m // 2)]


def one_run_lower_bound(
    scores: np.ndarray, included: np.ndarray, *, confidence: float = 0.95
) -> LowerBound:
    """The 95% (by default) lower bound from canary `scores` (higher: more likely
    included) and the auditor's record of which canaries were `included`."""
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = scores.size
    if m < 2 or included.shape != scores.shape:
        raise ValueError(f"{m} canary scores, {included.size} inclusion flags: need >= 2, equal")
    order = np.argsort(-scores, kind="stable")
    ranked = included[order]
    sizes = guess_sizes(m)
    beta = (1 - confidence) / len(sizes)
    best: LowerBound | None = None
    for k in sizes:
        correct = int(ranked[:k].sum() + (~ranked[m - k :]).sum())
        eps = binomial_epsilon_bound(2 * k, correct, beta)
        if best is None or eps > best.epsilon:
            best = LowerBound(eps, confidence, m, 2 * k, correct, k, k, len(sizes))
    assert best is not None
    return best
