import math

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, stats

from fedveil.privacy.dp import PrivacyEvent, calibrate_noise_multiplier, compute_epsilon
from fedveil.protocol.dp_rules import default_accountant


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of a Gaussian mechanism with sensitivity/sigma = mu (Balle-Wang 2018)."""

    def delta_at(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(
            -eps / mu - mu / 2
        )

    return optimize.brentq(lambda eps: delta_at(eps) - delta, 0.0, 200.0)


# Issue reference: Poisson, add/remove, q=0.01, z=1, T=1000, delta=1e-5.
@pytest.mark.parametrize(
    ("accountant", "expected"), [("rdp", 2.10), ("prv", 1.84), ("pld", 1.83), ("dpa_rdp", 2.10)]
)
def test_issue_reference_point(accountant, expected):
    event = PrivacyEvent(1.0, 0.01, 1000)
    assert compute_epsilon([event], 1e-5, accountant) == pytest.approx(expected, abs=0.01)


# Regression references (Poisson add/remove): values from Opacus 1.6 / dp-accounting 0.6.
@pytest.mark.parametrize(
    ("q", "z", "steps", "delta", "pld", "rdp"),
    [
        (0.05, 0.8, 200, 1e-6, 8.866, 9.905),
        (0.002, 1.1, 5000, 1e-6, 0.692, 0.978),
    ],
)
def test_poisson_reference_points(q, z, steps, delta, pld, rdp):
    event = PrivacyEvent(z, q, steps)
    assert compute_epsilon([event], delta, "pld") == pytest.approx(pld, rel=2e-3)
    assert compute_epsilon([event], delta, "rdp") == pytest.approx(rdp, rel=2e-3)


@pytest.mark.parametrize(
    ("z", "steps", "delta"), [(1.0, 1, 1e-5), (5.0, 50, 1e-5), (2.0, 10, 1e-6)]
)
def test_full_participation_is_a_valid_and_tight_bound_on_the_exact_gaussian(z, steps, delta):
    exact = exact_gaussian_epsilon(math.sqrt(steps) / z, delta)
    event = PrivacyEvent(z, 1.0, steps)
    for accountant in ("pld", "prv", "rdp"):
        epsilon = compute_epsilon([event], delta, accountant)
        assert epsilon >= exact * (1 - 1e-6), accountant  # an upper bound
    assert compute_epsilon([event], delta, "pld") <= exact * 1.01


@pytest.mark.parametrize(
    ("q", "z", "steps", "delta"), [(0.01, 1.0, 1000, 1e-5), (0.05, 0.8, 200, 1e-6)]
)
def test_default_accountant_is_within_5_percent_of_pld(q, z, steps, delta):
    event = PrivacyEvent(z, q, steps)
    pld = compute_epsilon([event], delta, "pld")
    reported = compute_epsilon(
        [event], delta, default_accountant("central_gaussian", "poisson", "add_remove")
    )
    assert pld <= reported <= 1.05 * pld
    prv = compute_epsilon([event], delta, "prv")
    assert pld * 0.99 <= prv <= 1.05 * pld


def test_fixed_size_full_cohort_equals_gaussian_with_double_sensitivity():
    # Replace-one moves the sum by up to 2C: z=4 with everyone sampled is a Gaussian
    # with sensitivity/sigma = 2/4 per round.
    event = PrivacyEvent(4.0, 1.0, 10, "fixed", "replace_one", population_size=500)
    exact = exact_gaussian_epsilon(math.sqrt(10) * 2 / 4, 1e-5)
    epsilon = compute_epsilon([event], 1e-5, "dpa_rdp")
    assert exact <= epsilon <= exact * 1.15
    assert epsilon == pytest.approx(8.079, rel=2e-3)


@pytest.mark.parametrize(
    ("population", "sample", "z", "steps", "delta", "expected"),
    [
        (1000, 50, 2.0, 200, 1e-5, 9.280),
        (10000, 100, 3.0, 2000, 1e-6, 3.445),
    ],
)
def test_fixed_size_reference_points(population, sample, z, steps, delta, expected):
    event = PrivacyEvent(z, sample / population, steps, "fixed", "replace_one", population)
    epsilon = compute_epsilon([event], delta, "dpa_rdp")
    assert epsilon == pytest.approx(expected, rel=2e-3)
    # Independently: dp-accounting with z halved (its sensitivity is the 2C distance).
    account = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    account.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(
                population, sample, dp_accounting.GaussianDpEvent(z / 2)
            ),
            steps,
        )
    )
    assert epsilon == pytest.approx(account.get_epsilon(delta))


def test_grouping_equals_event_by_event_and_is_order_free():
    a, b = PrivacyEvent(1.0, 0.02, 1), PrivacyEvent(1.5, 0.02, 1)
    events = [a] * 30 + [b] * 20
    grouped = compute_epsilon(
        [PrivacyEvent(1.0, 0.02, 30), PrivacyEvent(1.5, 0.02, 20)], 1e-5, "rdp"
    )
    assert compute_epsilon(events, 1e-5, "rdp") == pytest.approx(grouped)
    assert compute_epsilon(list(reversed(events)), 1e-5, "rdp") == pytest.approx(grouped)


def test_unsupported_combinations_are_rejected():
    with pytest.raises(ValueError, match="does not model"):
        compute_epsilon([PrivacyEvent(1.0, 0.01, 10, "poisson", "replace_one")], 1e-5, "rdp")
    with pytest.raises(ValueError, match="does not model") as refused:
        compute_epsilon([PrivacyEvent(1.0, 0.01, 10, "fixed", "replace_one", 1000)], 1e-5, "pld")
    # What it offers instead models the pair: never the refused accountant itself.
    offered = str(refused.value).split("allowed: ")[1]
    assert "'pld'" not in offered and "'dpa_rdp'" in offered, offered
    with pytest.raises(ValueError, match="mix"):
        compute_epsilon(
            [PrivacyEvent(1.0, 0.01), PrivacyEvent(1.0, 0.01, 1, "poisson", "replace_one")],
            1e-5,
            "pld",
        )
    assert compute_epsilon([], 1e-5, "pld") == 0.0


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_calibration_finds_the_smallest_sufficient_noise(accountant):
    z = calibrate_noise_multiplier(2.0, 1e-5, 300, 0.02, accountant=accountant)
    assert compute_epsilon([PrivacyEvent(z, 0.02, 300)], 1e-5, accountant) <= 2.0
    assert compute_epsilon([PrivacyEvent(z * 0.997, 0.02, 300)], 1e-5, accountant) > 2.0


def test_calibration_for_fixed_size_sampling():
    z = calibrate_noise_multiplier(
        8.0,
        1e-5,
        100,
        0.05,
        sampling="fixed",
        neighbouring="replace_one",
        population_size=1000,
        rel_tol=1e-2,
    )
    event = PrivacyEvent(z, 0.05, 100, "fixed", "replace_one", 1000)
    assert compute_epsilon([event], 1e-5, "dpa_rdp") <= 8.0


@pytest.mark.parametrize("neighbouring", ["add_remove", "replace_one"])
def test_pld_facade_matches_dp_accountings_pld_accountant(neighbouring):
    from dp_accounting.pld import pld_privacy_accountant

    relation = {
        "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[neighbouring]
    account = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    for z, steps in [(2.0, 40), (2.5, 25)]:
        account.compose(
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(0.03, dp_accounting.GaussianDpEvent(z)), steps
            )
        )
    events = [
        PrivacyEvent(2.0, 0.03, 40, neighbouring=neighbouring),
        PrivacyEvent(2.5, 0.03, 25, neighbouring=neighbouring),
    ]
    assert compute_epsilon(events, 1e-5, "pld") == pytest.approx(
        account.get_epsilon(1e-5), rel=1e-9
    )
