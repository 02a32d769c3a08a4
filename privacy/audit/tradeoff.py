"""The trade-off curve (f-DP, Dong, Roth and Su 2022) a run's ledger claims, from the
accountant's own privacy profile.

A mechanism that is (eps, delta(eps))-DP for every eps is f-DP for
f(a) = sup_eps max(0, 1 - delta(eps) - e^eps a, e^-eps (1 - delta(eps) - a)): every
test between two neighbouring outputs with type I error a has type II error >= f(a), in
both directions. For central DP the profile delta(eps) is the one dp-accounting's PLD
gives at the ledger's z, q and T (the 'pld' accountant's own distribution: exact for the
sampled Gaussian, with pessimistic discretisation), not a Gaussian-DP fit, which is not
sound in the tails. For a mechanism the PLD does not bound (distributed Skellam), the
profile is the run's own sound accountant's eps(delta) on a grid of deltas.

Every approximation errs towards a weaker claim, so a test against the curve stays
sound: the sup runs over a finite grid of eps (a smaller f), and the curve is kept as
`power` = 1 - f on a grid of type I errors `alpha`, inverted downwards between them
(`power_inverse`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from fedveil.privacy.dp.accounting import PLD_DISCRETIZATION, composed_pld, compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent, group_events
from fedveil.protocol.dp_rules import PLD

# Type I errors the curve is kept at: 0 and 2,500 log-spaced points from 1e-16 to 1.
ALPHA = np.concatenate([[0.0], np.geomspace(1e-16, 1.0, 2500)])
EPS_GRID = np.linspace(0.0, 60.0, 1201)  # the PLD's profile: delta at these eps
DELTA_GRID = np.geomspace(1e-15, 0.5, 90)  # other accountants: eps at these deltas


@dataclass(frozen=True)
class TradeoffCurve:
    """power[i] = 1 - f(alpha[i]): the most a test with type I error alpha[i] may detect
    (an upper bound on it: the curve's errors all favour the mechanism)."""

    alpha: np.ndarray
    power: np.ndarray

    def power_inverse(self, y: float) -> float:
        """A lower bound on inf{a : 1 - f(a) >= y}: the largest grid alpha whose power is
        still below y (inf when y exceeds the curve's top, 1)."""
        if y > self.power[-1]:
            return math.inf
        i = int(np.searchsorted(self.power, y, side="left"))
        return 0.0 if i == 0 else float(self.alpha[i - 1])


def curve_from_profile(epsilons: Sequence[float], deltas: Sequence[float]) -> TradeoffCurve:
    """The curve of a mechanism that is (eps_i, delta_i)-DP for each pair."""
    eps = np.asarray(epsilons, float)[None, :]
    dlt = np.clip(np.asarray(deltas, float), 0.0, 1.0)[None, :]
    a = ALPHA[:, None]
    f = np.maximum(0.0, np.maximum(1 - dlt - np.exp(eps) * a, np.exp(-eps) * (1 - dlt - a)))
    power = np.maximum.accumulate(1.0 - f.max(axis=1))  # non-decreasing, as 1 - f is
    return TradeoffCurve(ALPHA, power)


def claimed_curve(
    events: Sequence[PrivacyEvent],
    accountant: str = PLD,
    discretization: float = PLD_DISCRETIZATION,
) -> TradeoffCurve:
    """The trade-off curve of the composition of `events` under `accountant`'s profile
    (PLD: delta(eps) from the composed PLD, at the accountant's own discretisation
    unless a coarser, faster and still pessimistic one is asked for; any other
    accountant: eps(delta) on DELTA_GRID)."""
    return _claimed_curve(group_events(events), accountant, discretization)


@lru_cache(maxsize=64)
def _claimed_curve(
    events: tuple[PrivacyEvent, ...], accountant: str, discretization: float
) -> TradeoffCurve:
    if not events:
        raise ValueError("no privacy events: there is no claim to audit")
    if accountant == PLD:
        pld = composed_pld(events, discretization)
        deltas = np.asarray(pld.get_delta_for_epsilon(EPS_GRID), float)
        return curve_from_profile(EPS_GRID, deltas)
    pairs = [(compute_epsilon(events, float(d), accountant), float(d)) for d in DELTA_GRID]
    finite = [(e, d) for e, d in pairs if math.isfinite(e)]
    if not finite:
        return TradeoffCurve(ALPHA, np.ones_like(ALPHA))  # no claim: nothing refutes it
    return curve_from_profile([e for e, _ in finite], [d for _, d in finite])


def scaled_events(events: Sequence[PrivacyEvent], factor: float) -> list[PrivacyEvent]:
    """The same run with every noise multiplier times `factor` (the family of claims the
    audit's lower bound and ceiling range over: same sampling, rounds and clip)."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"noise factor = {factor}: must be a finite number > 0")
    return [replace(e, noise_multiplier=e.noise_multiplier * factor) for e in events]
