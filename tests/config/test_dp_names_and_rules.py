"""The [dp] keys under the ledger's names (the earlier spellings still read, with a warning
naming both), and the run config's refusals from the one DP rule table, each naming the
user's keys."""

from __future__ import annotations

import warnings

import pytest

from fedveil.config import ConfigError, config_from_dict, load_config
from fedveil.config.run import RENAMED_KEYS, DeprecatedKeyWarning
from fedveil.privacy.dp.plan import dp_config
from fedveil.server.engine.ledger_opening import opening_plan

CENTRAL = {"dp.mechanism": "central", "dp.epsilon": 8}


def test_old_dp_keys_read_as_the_new_ones_with_a_warning_naming_both(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[dp]\nmechanism = "central"\nepsilon = 8.0\nclip = 0.5\nadaptive_clip = true\n'
        "clip_lr = 0.3\n"
    )
    with pytest.warns(DeprecatedKeyWarning) as caught:
        old = load_config(path)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 3
    for before, after in RENAMED_KEYS.items():
        assert any(m.startswith(f"{before} is deprecated: use {after}") for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names: no warning
        new = load_config(
            None,
            {
                **CENTRAL,
                "dp.clip_norm": 0.5,
                "dp.adaptive_clipping": True,
                "dp.clip_learning_rate": 0.3,
            },
        )
    assert old == new
    assert (new.dp.clip_norm, new.dp.adaptive_clipping, new.dp.clip_learning_rate) == (
        0.5,
        True,
        0.3,
    )
    # A --set override under the old name, as the CLI passes it, is read the same way.
    with pytest.warns(DeprecatedKeyWarning, match=r"dp\.clip is deprecated: use dp\.clip_norm"):
        assert load_config(None, {**CENTRAL, "dp.clip": 0.25}).dp.clip_norm == 0.25


def test_both_spellings_with_different_values_are_refused():
    with pytest.raises(ConfigError, match=r"dp\.clip = 0\.5 and dp\.clip_norm = 0\.7"):
        config_from_dict({"dp": {**{"mechanism": "central", "epsilon": 8.0}, "clip": 0.5,
                                 "clip_norm": 0.7}})  # fmt: skip


def test_the_ledger_keeps_its_names():
    # The DP layer's config (release entries) and the opening record's plan are signed
    # records: their keys do not change with the run config's.
    cfg = load_config(None, {**CENTRAL, "dp.clip_norm": 0.5, "server.rounds": 3})
    resolved = dp_config(cfg.dp_parameters(), 100).to_dict()
    assert resolved["clip_norm"] == 0.5 and resolved["budget_epsilon"] == 8
    assert "clip_learning_rate" in resolved and "adaptive_clipping" in resolved
    plan = opening_plan(cfg)
    assert plan["clip"] == 0.5 and plan["adaptive_clip"] is False and plan["epsilon"] == 8


def test_an_accountant_that_does_not_model_the_sampling_is_refused_when_the_config_loads():
    # Before the one table, the validator let these through to the plan (a ValueError
    # naming DpConfig's fields, after the data had loaded).
    with pytest.raises(ConfigError) as error:
        load_config(None, {**CENTRAL, "dp.accountant": "pld"})  # fixed sampling by default
    assert str(error.value) == (
        "dp.accountant = 'pld' with server.sampling = 'fixed': only dp-accounting's RDP "
        "models fixed-size sampling without replacement (Wang, Balle and Kasiviswanathan "
        "2019); use 'auto' or 'dpa_rdp'"
    )
    poisson = {**CENTRAL, "server.sampling": "poisson", "dp.neighbouring": "replace_one"}
    with pytest.raises(ConfigError, match=r"^dp\.accountant = 'rdp' with server\.sampling = "
                       r"'poisson' and dp\.neighbouring = 'replace_one': Opacus"):  # fmt: skip
        load_config(None, {**poisson, "dp.accountant": "rdp"})
    assert load_config(None, {**poisson, "dp.accountant": "pld"}).dp.accountant == "pld"


def test_seeded_cohorts_are_checked_at_the_sampling_they_are_accounted_at():
    # Public cohorts are accounted unsampled (as Poisson, q = 1): dpa_rdp models fixed-size
    # replace-one but not Poisson replace-one, so the plan could not be built.
    seeded = {**CENTRAL, "dp.seeded_cohorts": True, "dp.accountant": "dpa_rdp"}
    assert load_config(None, {**CENTRAL, "dp.accountant": "dpa_rdp"})
    with pytest.raises(ConfigError) as error:
        load_config(None, seeded)
    message = str(error.value)
    assert message.startswith(
        "dp.accountant = 'dpa_rdp' with server.sampling = 'fixed' (dp.seeded_cohorts = true: "
        "accounted as 'poisson') and dp.neighbouring = 'replace_one': "
    )
    assert message.endswith("use 'auto' or 'pld'")
