"""The accountant registry against the one DP rule table and the run config's validator:
what each accountant declares sound is exactly what the table lists and what
`load_config` accepts, for every mechanism, accountant, sampling, neighbouring relation
and secure-aggregation setting."""

from __future__ import annotations

import itertools

import pytest

from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp.accounting import (
    Accountant,
    compute_epsilon,
    create_accountant,
    register_accountant,
    registered_accountants,
)
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol.dp_rules import (
    ACCOUNTANTS,
    AUTO,
    CONFIG_OF_MECHANISM,
    LEGACY_ACCOUNTANTS,
    MECHANISMS,
    NEIGHBOURING_RELATIONS,
    REFUSALS,
    SAMPLING_SCHEMES,
    SOUND,
    refusal,
    sound_accountants,
)

COMBINATIONS = list(itertools.product(MECHANISMS, SAMPLING_SCHEMES, NEIGHBOURING_RELATIONS))


def accepted(mechanism: str, accountant: str, sampling: str, neighbouring: str, secagg: bool):
    """Whether the run config's validator accepts the combination (a sync run, cohorts
    secret, so accounted at the configured sampling)."""
    values = {
        "dp.mechanism": mechanism,
        "dp.epsilon": 8,
        "dp.accountant": accountant,
        "dp.neighbouring": neighbouring,
        "server.sampling": sampling,
        "secagg.enabled": secagg,
    }
    try:
        load_config(None, values)
    except ConfigError:
        return False
    return True


def test_every_accountant_of_the_vocabulary_is_registered():
    assert registered_accountants() == ACCOUNTANTS
    for name in ACCOUNTANTS:
        assert create_accountant(name).name == name
    with pytest.raises(ValueError, match=r"accountant='nope' is invalid; allowed: \('pld'"):
        create_accountant("nope")


def test_each_accountant_declares_exactly_the_rule_tables_rows():
    for name in registered_accountants():
        listed = {c for c in COMBINATIONS if name in sound_accountants(*c)}
        assert create_accountant(name).sound_for == listed, name


def test_declarations_equal_what_the_run_config_enforces():
    # Every combination through the real validator: accepted exactly when the accountant
    # declares it sound, unless a rule refuses it whatever the accountant ('auto' refused
    # too: distributed DP without secure aggregation, the abort-status refusal).
    checked = 0
    for mechanism, accountant, sampling, neighbouring, secagg in itertools.product(
        CONFIG_OF_MECHANISM, registered_accountants(), SAMPLING_SCHEMES,
        NEIGHBOURING_RELATIONS, (False, True),
    ):  # fmt: skip
        name = CONFIG_OF_MECHANISM[mechanism]
        declared = (mechanism, sampling, neighbouring) in create_accountant(accountant).sound_for
        this = accepted(name, accountant, sampling, neighbouring, secagg)
        any_accountant = accepted(name, AUTO, sampling, neighbouring, secagg)
        assert this == (declared and any_accountant), (
            mechanism, accountant, sampling, neighbouring, secagg,
        )  # fmt: skip
        checked += 1
    assert checked == len(CONFIG_OF_MECHANISM) * len(ACCOUNTANTS) * 2 * 3 * 2
    # 'auto' is accepted (with or without secure aggregation) exactly where some
    # accountant declares the combination.
    for mechanism, sampling, neighbouring in COMBINATIONS:
        if mechanism not in CONFIG_OF_MECHANISM:
            continue
        declared = any(
            (mechanism, sampling, neighbouring) in create_accountant(a).sound_for
            for a in registered_accountants()
        )
        name = CONFIG_OF_MECHANISM[mechanism]
        somewhere = any(accepted(name, AUTO, sampling, neighbouring, s) for s in (False, True))
        assert somewhere == declared, (mechanism, sampling, neighbouring)


def test_every_unsound_combination_has_a_refusal_with_its_reason():
    for mechanism, sampling, neighbouring in COMBINATIONS:
        for accountant in ACCOUNTANTS:
            sound = accountant in sound_accountants(mechanism, sampling, neighbouring)
            row = refusal(mechanism, accountant, sampling, neighbouring, False)
            assert (row is None) == sound, (mechanism, accountant, sampling, neighbouring)
            if row is not None:
                assert (
                    row.why and row.fix and row.field in ("accountant", "neighbouring", "sampling")
                )
    assert all(row.why and row.accountants for row in SOUND)
    assert all(row.why for row in REFUSALS)
    assert set(LEGACY_ACCOUNTANTS) <= set(ACCOUNTANTS)


def test_the_registry_computes_what_it_declares_and_refuses_the_rest():
    event = PrivacyEvent(1.0, 0.1, 10, neighbouring="zero_out")
    epsilons = {a: compute_epsilon([event], 1e-5, a, mechanism="central_gaussian") for a in
                sound_accountants("central_gaussian", "poisson", "zero_out")}  # fmt: skip
    assert set(epsilons) == {"pld", "dpa_rdp", "rdp", "prv"}
    assert all(0 < e < 10 for e in epsilons.values())
    with pytest.raises(ValueError, match="not sound for mechanism='central_gaussian'"):
        compute_epsilon([event], 1e-5, "skellam_rdp_integer", mechanism="central_gaussian")
    replace_one = PrivacyEvent(1.0, 0.1, 10, neighbouring="replace_one")
    with pytest.raises(ValueError, match="does not model sampling='poisson'"):
        compute_epsilon([replace_one], 1e-5, "rdp")


def test_a_registered_accountant_serves_compute_epsilon():
    class Doubled(Accountant):
        """A test accountant: twice PLD's epsilon, declared for one combination."""

        name = "test_doubled_pld"
        sound_for = frozenset({("central_gaussian", "poisson", "add_remove")})

        def epsilon(self, grouped, delta):
            return 2 * create_accountant("pld").epsilon(grouped, delta)

    register_accountant(Doubled)
    try:
        event = PrivacyEvent(1.0, 0.1, 10)
        pld = compute_epsilon([event], 1e-5, "pld")
        assert compute_epsilon([event], 1e-5, Doubled.name) == pytest.approx(2 * pld)
        with pytest.raises(ValueError, match="registered already"):
            register_accountant(Doubled)
        zero_out = PrivacyEvent(1.0, 0.1, 10, neighbouring="zero_out")
        with pytest.raises(ValueError, match="does not model"):
            compute_epsilon([zero_out], 1e-5, Doubled.name)
    finally:
        from fedveil.privacy.dp import accounting

        del accounting._REGISTRY[Doubled.name]
