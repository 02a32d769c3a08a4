"""The one-run f-DP audit (after Mahloujifar, Melis and Chaudhuri, ICML 2025, "Auditing
f-Differential Privacy in One Run"): a test of the ledger's own trade-off curve.

Game. Each of m canaries is inserted independently with probability 1/2. After the run
the auditor ranks the canaries by a statistic fixed in advance (the harness: the sum
over rounds of each canary's projection) and makes k = 2 * (m // 4) guesses: "inserted"
for the m // 4 highest, "held out" for the m // 4 lowest, abstaining on the middle half.
The guesses depend on the released output only, so no count is forced wrong whatever
number was inserted (k+ = k- = m/2 errs whenever that number is not m/2).

Bound. Let C be the number of correct guesses and f the claimed curve. For one canary
j, given the others, "inserted" against "held out" are neighbouring runs; for the events
"guess j correct and C >= i" and "guess j wrong and C >= i - 1" (the second is the first
with j's bit flipped) f-DP gives, in both directions and by the convexity of f,
P[guess j correct, C >= i] <= 1 - f(P[guess j wrong, C >= i - 1]). Summing over the m
canaries (Jensen on the concave 1 - f), for every i in 1..k:

    E[C; C >= i] <= m (1 - f(E[(k - C); C >= i - 1] / m)).

`tail_bound` is the largest P[C >= v] any distribution of C on 0..k meeting all k
constraints allows: all of it at v, then at each lower level the least mass the
constraint above needs (the greedy solution of this convex program; checked against a
linear program on small cases). Observing v correct refutes the curve at confidence
1 - beta when that largest tail is <= beta.

The family of claims is the run with its noise multipliers scaled: the lower bound is
the epsilon of the least noise the observation refutes, and the ceiling that of the
least noise that k correct guesses out of k (perfect guessing) refute: no epsilon above
it can be refuted with m canaries, whatever the mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedveil.privacy.audit.tradeoff import TradeoffCurve, claimed_curve, scaled_events
from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent, group_events

CONFIDENCE = 0.99  # a tight test at 95% refutes a correct mechanism 1 in 20 by chance
FACTOR_RANGE = (1 / 2, 4.0)  # the noise factors the lower bound and ceiling search
FACTOR_STEPS = 7  # bisection steps in log(factor): z to within 1.6%
# The family's curves (not the claim's): a coarser PLD, pessimistic, so still sound.
FAMILY_DISCRETIZATION = 1e-3


def guesses_for(canaries: int) -> int:
    """k: the guesses made on `canaries` canaries (m // 4 each way; fixed in advance)."""
    if canaries < 4:
        raise ValueError(f"canaries = {canaries}: need at least 4 for one guess each way")
    return 2 * (canaries // 4)


def correct_guesses(scores: np.ndarray, inserted: np.ndarray) -> tuple[int, int]:
    """(k, correct): the m // 4 highest `scores` guessed inserted, the m // 4 lowest held
    out (ties broken by canary index, which is independent of who was inserted)."""
    scores, inserted = np.asarray(scores, float), np.asarray(inserted, bool)
    if scores.shape != inserted.shape or scores.ndim != 1:
        raise ValueError(f"{scores.size} scores, {inserted.size} inclusion flags: need equal")
    if not np.all(np.isfinite(scores)):
        raise ValueError("canary scores: not all finite")
    k = guesses_for(scores.size)
    half = k // 2
    order = np.argsort(-scores, kind="stable")
    correct = int(inserted[order[:half]].sum() + (~inserted[order[scores.size - half :]]).sum())
    return k, correct


def tail_bound(curve: TradeoffCurve, canaries: int, guesses: int, correct: int) -> float:
    """The largest P[C >= correct] an f-DP mechanism allows (see the module docstring)."""
    m, k, v = canaries, guesses, correct
    if not (1 <= k <= m and 0 <= v <= k):
        raise ValueError(f"canaries {m}, guesses {k}, correct {v}: need 0 <= v <= k <= m")
    if v == 0:
        return 1.0

    def least_mass(tau: float) -> float:
        # Mass tau at v; then for i = v..1 the least p_{i-1} constraint i needs.
        above, wrong, mass = v * tau, (k - v) * tau, tau  # E[C; C>=i], E[k-C; C>=i]
        for i in range(v, 0, -1):
            need = m * curve.power_inverse(above / m)
            if math.isinf(need):
                return math.inf
            p = max(0.0, (need - wrong) / (k - i + 1))
            mass += p
            if mass > 1.0:
                return mass
            above += (i - 1) * p
            wrong += (k - i + 1) * p
        return mass

    if least_mass(1.0) <= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0  # least_mass(hi) > 1: hi is infeasible, so P[C >= v] < hi
    for _ in range(50):
        mid = (lo + hi) / 2
        if least_mass(mid) <= 1.0:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class FdpAudit:
    """The f-DP audit of one run: the test of the claim, the lower bound, the ceiling."""

    p_value: float  # the largest P[C >= correct] the claimed curve allows
    refuted: bool  # p_value <= 1 - confidence
    lower_bound_epsilon: float  # the largest epsilon in the family the guesses refute
    ceiling_epsilon: float  # the largest epsilon perfect guessing could refute
    confidence: float
    canaries: int
    guesses: int
    correct: int
    delta: float

    def to_json(self) -> dict[str, object]:
        return {
            "method": "f-DP one-run (Mahloujifar, Melis, Chaudhuri 2025)",
            "p_value": self.p_value,
            "refuted": self.refuted,
            "lower_bound_epsilon": self.lower_bound_epsilon,
            "ceiling_epsilon": self.ceiling_epsilon,
            "confidence": self.confidence,
            "canaries": self.canaries,
            "guesses": self.guesses,
            "correct": self.correct,
            "delta": self.delta,
        }


def _refutes(
    events: tuple[PrivacyEvent, ...], accountant: str, m: int, k: int, v: int, beta: float
) -> Callable[[float], bool]:
    def refuted(factor: float) -> bool:
        curve = claimed_curve(scaled_events(events, factor), accountant, FAMILY_DISCRETIZATION)
        return tail_bound(curve, m, k, v) <= beta

    return refuted


def _largest_refuted_epsilon(
    events: tuple[PrivacyEvent, ...],
    delta: float,
    accountant: str,
    refuted: Callable[[float], bool],
) -> float:
    """The epsilon of the least noise factor in FACTOR_RANGE refuted (0 if none is; that
    of the range's least when all are, so a floor): refutation is monotone in the factor,
    as more noise only raises the curve."""
    lo, hi = (math.log(f) for f in FACTOR_RANGE)
    if not refuted(math.exp(hi)):
        return 0.0
    if refuted(math.exp(lo)):
        hi = lo  # refuted across the whole range: the bound is at its edge (a floor)
    else:
        for _ in range(FACTOR_STEPS):
            mid = (lo + hi) / 2
            if refuted(math.exp(mid)):
                hi = mid
            else:
                lo = mid
    return compute_epsilon(scaled_events(events, math.exp(hi)), delta, accountant)


def fdp_audit(
    scores: np.ndarray,
    inserted: np.ndarray,
    events: Sequence[PrivacyEvent],
    delta: float,
    accountant: str,
    *,
    confidence: float = CONFIDENCE,
    bounds: bool = True,
) -> FdpAudit:
    """Test the claim (`events` under `accountant`'s profile) on the canaries' `scores`.
    `bounds=False` skips the searches for the lower bound and the ceiling (NaN: for
    benchmarks and tests that need only the test)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence}: must be in (0, 1)")
    grouped = group_events(events)
    m = int(np.asarray(inserted).size)
    k, v = correct_guesses(scores, inserted)
    beta = 1 - confidence
    p = tail_bound(claimed_curve(grouped, accountant), m, k, v)
    lower = ceiling = math.nan
    if bounds:
        refuted = _refutes(grouped, accountant, m, k, v, beta)
        lower = _largest_refuted_epsilon(grouped, delta, accountant, refuted)
        ceiling = ceiling_epsilon(grouped, delta, accountant, m, confidence)
    return FdpAudit(
        p,
        p <= beta,
        lower,
        ceiling,
        confidence,
        m,
        k,
        v,
        delta,
    )


def ceiling_epsilon(
    events: Sequence[PrivacyEvent],
    delta: float,
    accountant: str,
    canaries: int,
    confidence: float = CONFIDENCE,
) -> float:
    """The largest epsilon (in the family of `events` with scaled noise) that this design
    refutes even when all its guesses are right: "this audit cannot refute any epsilon
    above" it with `canaries` canaries."""
    return _ceiling(group_events(events), delta, accountant, canaries, confidence)


@lru_cache(maxsize=32)
def _ceiling(
    events: tuple[PrivacyEvent, ...], delta: float, accountant: str, m: int, confidence: float
) -> float:
    k = guesses_for(m)
    refuted = _refutes(events, accountant, m, k, k, 1 - confidence)
    return _largest_refuted_epsilon(events, delta, accountant, refuted)
