"""Sound accounting for distributed DP: refused accountants and relations, the general
subsampled-RDP bounds, and per-client (coordinator) epsilons."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from scipy import stats
from scipy.special import logsumexp

from fedveil.cli.main import main
from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp import (
    DpConfig,
    PrivacyEvent,
    SkellamParams,
    calibrate_noise_multiplier,
    compute_epsilon,
    coordinator_epsilon_after,
    individual_epsilon,
    individual_epsilon_summary,
    individual_epsilons,
    sound_accountants,
)
from fedveil.privacy.dp.subsampled_rdp import (
    gaussian_curve,
    poisson_general_rdp,
    poisson_mixture_rdp,
    without_replacement_general_rdp,
)
from fedveil.protocol.dp_rules import default_accountant, default_neighbouring

SKELLAM = "distributed_skellam"
INTEGER_ORDERS = np.arange(2, 65, dtype=np.float64)


def skellam_config(**overrides):
    values = dict(
        mechanism=SKELLAM,
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=0.1,
        rounds=10,
        delta=1e-5,
        budget_epsilon=8.0,
    )
    values.update(overrides)
    return DpConfig(**values)


# ----------------------------------------------------------------- refusals
@pytest.mark.parametrize("accountant", ["pld", "prv", "rdp", "dpa_rdp"])
def test_dpconfig_refuses_accountants_unsound_for_skellam(accountant):
    with pytest.raises(ValueError) as error:
        skellam_config(accountant=accountant)
    message = str(error.value)
    assert message.startswith(f"DpConfig.accountant={accountant!r} is invalid; allowed: ")
    assert "('skellam_rdp_integer',) for mechanism 'distributed_skellam'" in message


@pytest.mark.parametrize(
    "overrides",
    [
        dict(neighbouring="add_remove"),
        dict(
            neighbouring="add_remove",
            sampling="fixed",
            population_size=100,
            cohort_size=10,
        ),
    ],
)
def test_dpconfig_refuses_add_remove_for_distributed_dp(overrides):
    # The target's noise share leaves with it: a change of variance, not a shift.
    with pytest.raises(ValueError, match=r"DpConfig\.neighbouring='add_remove' is invalid"):
        skellam_config(**overrides)


def test_compute_epsilon_refuses_pld_for_skellam_when_told_the_mechanism():
    event = PrivacyEvent(1.0, 0.1, 10, neighbouring="zero_out")
    assert compute_epsilon([event], 1e-5, "pld") > 0  # Gaussian events: fine
    with pytest.raises(ValueError, match="not sound for mechanism='distributed_skellam'"):
        compute_epsilon([event], 1e-5, "pld", mechanism=SKELLAM)
    assert compute_epsilon([event], 1e-5, "skellam_rdp_integer", mechanism=SKELLAM) > 0


def distributed(**overrides):
    values = {"dp.mechanism": "distributed", "dp.epsilon": 8, "secagg.enabled": True}
    values.update(overrides)
    return load_config(None, values)


@pytest.mark.parametrize("accountant", ["pld", "prv", "rdp", "dpa_rdp"])
def test_run_config_refuses_unsound_accountants_for_distributed_dp(accountant):
    with pytest.raises(ConfigError) as error:
        distributed(**{"dp.accountant": accountant})
    assert str(error.value) == (
        f"dp.accountant = {accountant!r}: not sound for distributed DP (Skellam); "
        "use 'auto' or 'skellam_rdp_integer'"
    )


def test_run_config_refuses_add_remove_and_fixed_zero_out():
    with pytest.raises(ConfigError, match=r"dp\.neighbouring = 'add_remove': not sound"):
        distributed(**{"dp.neighbouring": "add_remove", "server.sampling": "poisson"})
    with pytest.raises(ConfigError, match=r"dp\.neighbouring = 'zero_out' with server\.sampling"):
        distributed(**{"dp.neighbouring": "zero_out", "server.sampling": "fixed"})
    with pytest.raises(ConfigError, match=r"dp\.accountant = 'skellam_rdp_integer': only for"):
        load_config(
            None,
            {"dp.mechanism": "central", "dp.epsilon": 8, "dp.accountant": "skellam_rdp_integer"},
        )
    assert (
        distributed(**{"dp.accountant": "skellam_rdp_integer"}).dp.accountant
        == "skellam_rdp_integer"
    )
    poisson = {"dp.neighbouring": "zero_out", "server.sampling": "poisson"}
    assert distributed(**poisson).dp.neighbouring == "zero_out"


def test_cli_refuses_pld_for_distributed_dp_before_loading_data(tmp_path, monkeypatch, capsys):
    # In process: main([...]) is the console script's body, and the refusal comes before
    # any data or torch work.
    monkeypatch.setenv("FEDVEIL_DATA", str(tmp_path / "nothing"))
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            *("simulate", "--out", str(tmp_path / "r")),
            *("--dp", "distributed", "--secagg", "--epsilon", "8", "--set", "dp.accountant=pld"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "dp.accountant = 'pld': not sound for distributed DP (Skellam)" in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


# ------------------------------------------------------------- auto choices
def test_auto_resolves_per_mechanism():
    assert default_neighbouring(SKELLAM, "poisson") == "zero_out"
    assert default_neighbouring(SKELLAM, "fixed") == "replace_one"
    assert default_neighbouring("central_gaussian", "poisson") == "add_remove"
    assert default_neighbouring("central_gaussian", "fixed") == "replace_one"
    assert default_accountant(SKELLAM, "poisson", "zero_out") == "skellam_rdp_integer"
    assert default_accountant(SKELLAM, "fixed", "replace_one") == "skellam_rdp_integer"
    assert default_accountant("central_gaussian", "poisson", "add_remove") == "pld"
    assert default_accountant("central_gaussian", "fixed", "replace_one") == "dpa_rdp"
    assert sound_accountants(SKELLAM, "poisson", "add_remove") == ()
    assert sound_accountants(SKELLAM, "poisson", "zero_out") == ("skellam_rdp_integer",)
    assert "skellam_rdp_integer" not in sound_accountants("central_gaussian", "poisson", "zero_out")
    fixed = skellam_config(sampling="fixed", population_size=100, cohort_size=10)
    assert (fixed.neighbouring, fixed.accountant_name) == ("replace_one", "skellam_rdp_integer")
    central = DpConfig(**{**skellam_config().to_dict(), "mechanism": "central_gaussian"})
    assert (central.neighbouring, central.accountant_name) == ("zero_out", "pld")
    assert (
        DpConfig("central_gaussian", 1.0, 1.0, 0.1, 10, 1e-5, 8.0, neighbouring="auto").neighbouring
        == "add_remove"
    )


def test_calibration_uses_the_sound_accountant_for_skellam():
    z = calibrate_noise_multiplier(4.0, 1e-5, 50, 0.1, mechanism=SKELLAM)
    event = PrivacyEvent(z, 0.1, 50, neighbouring="zero_out")
    assert compute_epsilon([event], 1e-5, "skellam_rdp_integer") <= 4.0
    assert (
        compute_epsilon([replace(event, noise_multiplier=z * 0.99)], 1e-5, "skellam_rdp_integer")
        > 4
    )
    with pytest.raises(ValueError, match="not sound"):
        calibrate_noise_multiplier(4.0, 1e-5, 50, 0.1, mechanism=SKELLAM, accountant="pld")
    with pytest.raises(ValueError, match="no accountant is sound"):
        calibrate_noise_multiplier(4.0, 1e-5, 50, 0.1, mechanism=SKELLAM, neighbouring="add_remove")
    fixed = calibrate_noise_multiplier(
        4.0, 1e-5, 50, 0.1, sampling="fixed", population_size=100, mechanism=SKELLAM
    )
    fixed_event = PrivacyEvent(fixed, 0.1, 50, "fixed", "replace_one", 100)
    assert compute_epsilon([fixed_event], 1e-5, "skellam_rdp_integer") <= 4.0


# ------------------------------------------------------ central DP unchanged
@pytest.mark.parametrize("accountant", ["pld", "dpa_rdp"])
def test_zero_out_composes_like_add_remove_for_central_gaussian(accountant):
    events = [PrivacyEvent(1.1, 0.05, 30), PrivacyEvent(1.4, 0.05, 20)]
    zero_out = [replace(e, neighbouring="zero_out") for e in events]
    assert compute_epsilon(zero_out, 1e-5, accountant) == pytest.approx(
        compute_epsilon(events, 1e-5, accountant), rel=1e-9
    )


def test_skellam_zero_out_has_the_add_remove_sensitivity():
    params = SkellamParams.calibrate(dim=1000, clip_norm=1.0, noise_multiplier=1.0, num_clients=10)
    assert params.noise_multiplier_for(10, "zero_out") == params.noise_multiplier_for(10)


# --------------------------------------------------- general subsampled RDP
@pytest.mark.parametrize(("q", "z"), [(0.01, 1.0), (0.1, 1.0), (0.3, 0.8), (0.05, 3.0)])
def test_zhu_wang_general_bound_dominates_the_tight_gaussian_curve(q, z):
    tight = dpa_rdp._compute_rdp_poisson_subsampled_gaussian(q, z, INTEGER_ORDERS)
    general = poisson_general_rdp(gaussian_curve(z), q, INTEGER_ORDERS)
    assert np.all(general >= tight * (1 - 1e-9))
    assert np.all(general <= 5 * tight)  # within a sensible factor of the tight analysis
    mixture = poisson_mixture_rdp(gaussian_curve(z), q, INTEGER_ORDERS)
    assert np.all(mixture >= tight * (1 - 1e-9)) and np.all(general <= mixture)


def _replace_one_pair_rdp(q: float, z: float, orders: np.ndarray) -> np.ndarray:
    """Exact RDP of one replace-one pair under sampling: (1-q)N(0) + qN(+1/2) against
    (1-q)N(0) + qN(-1/2), std z. A lower bound on what any valid bound must give."""
    x = np.linspace(-40 * z, 40 * z, 400_001)
    log_out = math.log1p(-q) + stats.norm.logpdf(x, 0, z)
    log_p = np.logaddexp(log_out, math.log(q) + stats.norm.logpdf(x, 0.5, z))
    log_q = np.logaddexp(log_out, math.log(q) + stats.norm.logpdf(x, -0.5, z))
    cell = math.log(x[1] - x[0])
    return np.array([(logsumexp(a * log_p + (1 - a) * log_q) + cell) / (a - 1) for a in orders])


@pytest.mark.parametrize(("q", "z"), [(0.01, 1.0), (0.1, 2.0), (0.5, 3.0)])
def test_wbk_general_bound_is_valid_and_close_to_dp_accountings_gaussian_bound(q, z):
    orders = INTEGER_ORDERS[:31]
    general = without_replacement_general_rdp(gaussian_curve(z), q, orders)
    assert np.all(general >= _replace_one_pair_rdp(q, z, orders) * (1 - 1e-6))
    # dp-accounting adds a Gaussian-only term (WBK19 Thm 27); ours stays within 3x of it.
    gaussian = dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, orders)
    assert np.all(general <= 3 * gaussian)


@pytest.mark.parametrize(
    "bound", [poisson_general_rdp, poisson_mixture_rdp, without_replacement_general_rdp]
)
def test_general_bounds_are_the_base_curve_at_q_1_and_grow_with_q(bound):
    base = gaussian_curve(1.5)
    assert np.array_equal(bound(base, 1.0, INTEGER_ORDERS), base(INTEGER_ORDERS))
    curves = [bound(base, q, INTEGER_ORDERS) for q in (0.001, 0.01, 0.05, 0.2, 0.5, 0.9, 1.0)]
    for lower, higher in itertools.pairwise(curves):
        assert np.all(lower <= higher * (1 + 1e-12))


def _renyi2_distributed_poisson(dim: int, others: int, q: float, z: float = 1.0) -> float:
    """Exact order-2 Renyi divergence of a Poisson-sampled sum of Gaussian noise shares.

    Each of `others` + target adds a share; zero-out neighbours differ by a unit shift
    of the target's contribution. Sufficient statistics: the coordinate along the shift
    and the squared norm of the other dim - 1 coordinates, whose scale reveals how many
    shares (was the target sampled?).
    """
    share = z**2 / (others + 1)  # z of the sampled pair is z
    v_out, v_in = others * share, (others + 1) * share
    u = np.linspace(-10 * z, 11 * z, 700)
    r = np.linspace(
        stats.chi2.ppf(1e-13, dim - 1) * v_out, stats.chi2.ppf(1 - 1e-13, dim - 1) * v_in, 1500
    )
    grid_u, grid_r = np.meshgrid(u, r, indexing="ij")

    def log_density(mean: float, variance: float) -> np.ndarray:
        return (
            stats.norm.logpdf(grid_u, mean, math.sqrt(variance))
            + stats.chi2.logpdf(grid_r / variance, dim - 1)
            - math.log(variance)
        )

    out = math.log1p(-q) + log_density(0.0, v_out)
    log_p = np.logaddexp(out, math.log(q) + log_density(1.0, v_in))
    log_q = np.logaddexp(out, math.log(q) + log_density(0.0, v_in))
    cell = math.log((u[1] - u[0]) * (r[1] - r[0]))
    assert abs(logsumexp(log_q) + cell) < 1e-3  # the grid holds the mass
    return float(logsumexp(2 * log_p - log_q) + cell)


def test_zhu_wang_underestimates_distributed_dp_so_the_mixture_bound_is_used():
    # The adversary reads the noise norm: with 1000 coordinates it tells n from n + 1
    # shares, i.e. whether the target took part. The quadratic-in-q bound is then false.
    q, orders = 0.1, np.array([2.0])
    exact = _renyi2_distributed_poisson(dim=1000, others=9, q=q)
    zhu_wang = poisson_general_rdp(gaussian_curve(1.0), q, orders)[0]
    mixture = poisson_mixture_rdp(gaussian_curve(1.0), q, orders)[0]
    assert exact > 3 * zhu_wang
    assert exact <= mixture
    event = PrivacyEvent(1.0, q, 1, neighbouring="zero_out")
    from fedveil.privacy.dp.accounting import skellam_rdp_curve

    assert skellam_rdp_curve(event)[list(_orders()).index(2.0)] == pytest.approx(mixture)


def _orders():
    from fedveil.privacy.dp.subsampled_rdp import DEFAULT_ORDERS

    return DEFAULT_ORDERS


# ---------------------------------------------------- individual accounting
def test_individual_epsilon_is_the_unamplified_composition():
    events = [
        PrivacyEvent(1.0, 0.1, 1, neighbouring="zero_out"),
        PrivacyEvent(1.2, 0.1, 1, neighbouring="zero_out"),
        PrivacyEvent(1.0, 0.1, 1, neighbouring="zero_out"),
    ]
    unsampled = [replace(e, sampling_rate=1.0) for e in events]
    value = individual_epsilon(events, 1e-5)
    assert value == compute_epsilon(unsampled, 1e-5, "skellam_rdp_integer")
    assert value > compute_epsilon(events, 1e-5, "skellam_rdp_integer")  # no amplification
    # Sandwiched between the exact Gaussian epsilon and the zCDP conversion.
    rho = sum(1 / (2 * e.noise_multiplier**2) for e in events)
    assert value <= rho + 2 * math.sqrt(rho * math.log(1e5))
    exact = compute_epsilon([PrivacyEvent(math.sqrt(1 / (2 * rho)), 1.0)], 1e-5, "pld")
    assert exact <= value <= 1.15 * exact


def test_individual_epsilon_of_replace_one_fixed_events():
    event = PrivacyEvent(2.0, 0.1, 4, "fixed", "replace_one", 100)
    # replace-one: outputs differ by 2B, so the curve is that of z / 2.
    assert individual_epsilon([event], 1e-5) == pytest.approx(
        individual_epsilon([PrivacyEvent(1.0, 0.5, 4, neighbouring="zero_out")], 1e-5)
    )


def test_individual_epsilons_for_many_clients_and_the_summary():
    event = PrivacyEvent(1.0, 0.1, neighbouring="zero_out")
    participations = {client: [event] * (client % 7) for client in range(1000)}
    epsilons = individual_epsilons(participations, 1e-5)
    assert len(epsilons) == 1000 and epsilons[0] == 0.0
    assert epsilons[13] == individual_epsilon([event] * 6, 1e-5)
    assert coordinator_epsilon_after(5, event, 1e-5) == pytest.approx(epsilons[13])
    summary = individual_epsilon_summary(epsilons)
    assert summary["max"] == epsilons[6] and summary["clients"] == 1000
    assert summary["p50"] == epsilons[3] and summary["p90"] == epsilons[6]
    assert sum(row["clients"] for row in summary["histogram"]) == 1000
    with pytest.raises(ValueError, match="not model"):
        individual_epsilon([PrivacyEvent(1.0, 0.1)], 1e-5)  # add/remove: refused


# ------------------------------- add/remove beside secure aggregation's abort
CENTRAL_SECAGG_POISSON = {
    "dp.mechanism": "central",
    "dp.epsilon": 8,
    "secagg.enabled": True,
    "server.sampling": "poisson",
}


def test_run_config_refuses_add_remove_with_central_dp_secagg_and_poisson():
    # The public abort status depends on whether the target was sampled.
    with pytest.raises(ConfigError) as error:
        load_config(None, {**CENTRAL_SECAGG_POISSON, "dp.neighbouring": "add_remove"})
    message = str(error.value)
    assert message.startswith("dp.neighbouring = 'add_remove' with dp.mechanism = 'central'")
    assert "abort status" in message and "'zero_out'" in message
    # What stays accepted: auto (zero_out here), explicit zero_out, and add/remove where
    # no secure-aggregation round can abort on who was sampled.
    assert load_config(None, CENTRAL_SECAGG_POISSON).dp.neighbouring == "auto"
    assert load_config(None, {**CENTRAL_SECAGG_POISSON, "dp.neighbouring": "zero_out"})
    clear = {**CENTRAL_SECAGG_POISSON, "secagg.enabled": False, "dp.neighbouring": "add_remove"}
    assert load_config(None, clear).dp.neighbouring == "add_remove"


def test_every_refused_relation_of_the_rule_table_is_refused_by_the_validator():
    from fedveil.protocol.dp_rules import REFUSED_NEIGHBOURING, default_neighbouring
    from fedveil.server.engine.dp_from_config import dp_config, resolve_neighbouring

    names = {"central_gaussian": "central", SKELLAM: "distributed"}
    assert REFUSED_NEIGHBOURING
    for mechanism, sampling, neighbouring, secagg in REFUSED_NEIGHBOURING:
        values = {
            "dp.mechanism": names[mechanism],
            "dp.epsilon": 8,
            "secagg.enabled": secagg,
            "server.sampling": sampling,
        }
        with pytest.raises(ConfigError, match=rf"dp\.neighbouring = '{neighbouring}'"):
            load_config(None, {**values, "dp.neighbouring": neighbouring})
        # `auto` never resolves to a refused relation, in the plan or the vocabulary.
        cfg = load_config(None, values)
        assert resolve_neighbouring(cfg) != neighbouring
        assert default_neighbouring(mechanism, sampling, secagg) != neighbouring
        assert dp_config(cfg, 100).neighbouring == resolve_neighbouring(cfg)


def test_cli_simulate_refuses_add_remove_with_central_dp_secagg_and_poisson(
    tmp_path, monkeypatch, capsys
):
    # In process, as the other CLI refusals here: the refusal comes before any data work.
    monkeypatch.setenv("FEDVEIL_DATA", str(tmp_path / "nothing"))
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            *("simulate", "--out", str(tmp_path / "r")),
            *("--dp", "central", "--secagg", "--epsilon", "8"),
            *("--set", "server.sampling=poisson", "--set", "dp.neighbouring=add_remove"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "dp.neighbouring = 'add_remove' with dp.mechanism = 'central'" in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
