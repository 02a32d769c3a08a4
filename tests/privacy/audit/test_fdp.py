"""The one-run f-DP audit (issue 28): at the README's defaults (central DP, epsilon 8,
delta 1e-5, q = 0.2, T = 60, 2,000 canaries) it refutes noise cut 4x and noise off and
passes the correct mechanism, on the idealised simulation with fixed seeds; its ceiling;
and the tail bound's shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedveil.privacy.audit import ceiling_epsilon, claimed_curve, fdp_audit, tail_bound
from fedveil.privacy.audit.canary_sums import simulate_canary_sums
from fedveil.privacy.audit.fdp import correct_guesses
from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent

Q, T, Z, DELTA, M = 0.2, 60, 1.216, 1e-5, 2000  # README defaults: epsilon 8


def claim(z: float = Z, q: float = Q, steps: int = T) -> list[PrivacyEvent]:
    return [PrivacyEvent(noise_multiplier=z, sampling_rate=q, steps=steps)]


def test_the_claim_is_epsilon_8():
    assert compute_epsilon(claim(), DELTA, "pld") == pytest.approx(8.0, abs=0.01)


@pytest.mark.parametrize(
    ("noise_scale", "seeds", "refuted"),
    [(0.25, (0, 1), True), (0.0, (0,), True), (1.0, (0, 1, 2), False)],
    ids=["noise cut 4x", "noise off", "correct"],
)
def test_the_three_outcomes_on_the_idealised_simulation(noise_scale, seeds, refuted):
    for seed in seeds:
        rng = np.random.default_rng([7, seed])
        inserted, stats = simulate_canary_sums(rng, M, Q, T, Z, noise_scale)
        audit = fdp_audit(stats, inserted, claim(), DELTA, "pld", bounds=False)
        assert audit.refuted is refuted, (seed, audit)
        assert audit.confidence == 0.99 and audit.guesses == 1000


def test_the_ceiling_at_2000_canaries_is_above_the_claim():
    # Perfect guessing (1000 of 1000) refutes the claim; the ceiling is the epsilon of
    # the least noise it still refutes: about 9.8 at 99% (the bound without f-DP, the
    # Steinke-Nasr-Jagielski one, cannot reach 8 at any canary count below ~30,000).
    ceiling = ceiling_epsilon(claim(), DELTA, "pld", M)
    assert 9.0 < ceiling < 11.0


def test_more_canaries_raise_the_ceiling_and_too_few_cannot_refute_the_claim():
    # A cheap claim (one unsampled Gaussian release, epsilon ~ 4.3 at 1e-5).
    events = claim(z=1.0, q=1.0, steps=1)
    eps = compute_epsilon(events, DELTA, "pld")
    small, large = (ceiling_epsilon(events, DELTA, "pld", m) for m in (40, 2000))
    assert small < large
    assert small < eps < large  # 40 canaries cannot refute this claim, 2000 can


def test_tail_bound_is_one_at_chance_and_falls_with_correct_guesses():
    curve = claimed_curve(claim(z=1.0, q=1.0, steps=1))
    tails = [tail_bound(curve, 1000, 500, v) for v in (250, 350, 450, 500)]
    assert tails[0] == 1.0
    assert tails == sorted(tails, reverse=True) and tails[-1] < 1e-3


def test_a_weaker_claim_is_harder_to_refute():
    strong, weak = claimed_curve(claim(z=2.0, q=1.0, steps=1)), claimed_curve(claim(1.0, 1.0, 1))
    assert tail_bound(strong, 1000, 500, 420) < tail_bound(weak, 1000, 500, 420)


def test_guesses_are_a_quarter_each_way_and_never_forced_wrong():
    # 10 inserted of 16: k+ = k- = m/2 would force 2 errors; a quarter each way none.
    inserted = np.array([True] * 10 + [False] * 6)
    scores = inserted.astype(float)
    assert correct_guesses(scores, inserted) == (8, 8)
    with pytest.raises(ValueError, match="not all finite"):
        correct_guesses(np.full(16, math.nan), inserted)
