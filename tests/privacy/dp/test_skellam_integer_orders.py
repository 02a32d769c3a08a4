"""Distributed DP is accounted at integer Renyi orders only (issue 28, "Fractional Renyi
orders"): the Agarwal-Kairouz-Liu Skellam bound is proven for integer orders, and the
accountant that evaluated it at 1.1-10.9 too ('skellam_rdp') stays only so that old
ledgers verify as what they were. New runs name 'skellam_rdp_integer'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import optimize

from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp import (
    DpConfig,
    Ledger,
    PrivacyBudget,
    PrivacyEvent,
    SkellamParams,
    calibrate_noise_multiplier,
    compute_epsilon,
    verify_ledger,
)
from fedveil.privacy.dp.accounting import individual_epsilon, skellam_orders
from fedveil.privacy.dp.ledger import RECORD_FIELDS, RELEASE, SIGNATURE_FIELDS, entry_kind
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.privacy.dp.subsampled_rdp import rdp_to_epsilon
from fedveil.server.engine.dp_from_config import dp_config

SKELLAM = "distributed_skellam"
DELTA = 1e-5
ROUNDS = 6


SHARES = 7
# Real discrete-mechanism parameters, so that the verifier re-derives each release's z.
PARAMS = SkellamParams.calibrate(dim=100, clip_norm=1.0, noise_multiplier=1.2, num_clients=SHARES)


def _config(**overrides: Any) -> DpConfig:
    values: dict[str, Any] = dict(
        mechanism=SKELLAM,
        noise_multiplier=PARAMS.noise_multiplier_for(SHARES, "zero_out"),
        clip_norm=1.0,
        sampling_rate=0.2,
        rounds=ROUNDS,
        delta=DELTA,
        budget_epsilon=100.0,
        population_size=100,
        cohort_size=20,
    )
    values.update(overrides)
    return DpConfig(**values)


def _new_ledger(path: Path, cfg: DpConfig) -> None:
    """A signed distributed-DP ledger as today's engine writes it."""
    ledger = Ledger(path, run_id="run-int", signer=load_or_create_signer())
    budget = PrivacyBudget(cfg)
    for number in range(1, ROUNDS + 1):
        bound = individual_epsilon([cfg.round_event()] * number, cfg.delta)
        extra = {
            "training_round": number,
            "noise_shares": SHARES,
            "skellam": PARAMS.to_dict(),
            "epsilon_coordinator_bound": bound,
        }
        budget.record_release(
            ledger, round_number=number, event=cfg.round_event(), clip_norm=1.0, extra=extra
        )
    ledger.close("final", {"training_round": ROUNDS, "epsilon": budget.spent()})


def _as_written_before(source: Path, path: Path, accountant: str = "skellam_rdp") -> float:
    """The same releases as a ledger from before skellam_rdp_integer: it names the legacy
    accountant and records its figures (fractional orders). Returns its final epsilon."""
    ledger = Ledger(path, run_id="run-old", signer=load_or_create_signer())
    events: list[PrivacyEvent] = []
    epsilon = 0.0
    for entry in Ledger(source).entries:
        if entry_kind(entry) != RELEASE:
            continue
        fields = {k: v for k, v in entry.items() if k not in (*RECORD_FIELDS, *SIGNATURE_FIELDS)}
        events.append(
            PrivacyEvent(
                entry["noise_multiplier"], entry["sampling_rate"], 1, neighbouring="zero_out"
            )
        )
        epsilon = compute_epsilon(events, DELTA, "skellam_rdp")
        bound = individual_epsilon(
            [PrivacyEvent(e.noise_multiplier, 1.0, 1, neighbouring="zero_out") for e in events],
            DELTA,
            "skellam_rdp",
        )
        fields.update(accountant=accountant, epsilon=epsilon, epsilon_coordinator_bound=bound)
        ledger.record(fields)
    ledger.close("final", {"training_round": ROUNDS, "epsilon": epsilon})
    return epsilon


def test_an_old_ledger_verifies_as_what_it_was(tmp_path):
    cfg = _config()
    _new_ledger(tmp_path / "new.jsonl", cfg)
    old_epsilon = _as_written_before(tmp_path / "new.jsonl", tmp_path / "old.jsonl")
    result = verify_ledger(tmp_path / "old.jsonl")
    assert result.ok, result.message
    # Recomputed with the accountant it names: the fractional-order figure it recorded.
    assert result.final_epsilon == pytest.approx(old_epsilon, rel=1e-9)
    assert "accountant 'skellam_rdp' (legacy" in result.message
    assert "new ledgers use 'skellam_rdp_integer'" in result.message
    # The integer-order figure of the same releases is higher: the legacy one is not it.
    new = verify_ledger(tmp_path / "new.jsonl")
    assert new.ok, new.message
    assert new.final_epsilon > old_epsilon * (1 + 1e-4)
    assert "legacy" not in new.message
    # Figures of the old accountant under the new name do not verify: `privacy verify`
    # recomputes with the accountant the ledger names.
    _as_written_before(tmp_path / "new.jsonl", tmp_path / "relabelled.jsonl", "skellam_rdp_integer")
    relabelled = verify_ledger(tmp_path / "relabelled.jsonl")
    assert not relabelled.ok
    assert "recomputed" in relabelled.message


def test_new_runs_account_at_integer_orders_only(tmp_path):
    values = {
        "dp.mechanism": "distributed",
        "dp.epsilon": 8,
        "secagg.enabled": True,
        "server.rounds": 20,
    }
    cfg = dp_config(load_config(None, values), 100)
    assert cfg.accountant_name == "skellam_rdp_integer"
    orders = np.asarray(skellam_orders(cfg.accountant_name))
    assert np.all(orders == np.round(orders)) and orders.min() == 2
    # The epsilon is the composed curve's conversion at those orders, nothing finer.
    z = 1.3
    event = PrivacyEvent(z, 1.0, 12, neighbouring="zero_out")
    curve = 12 * orders / (2 * z * z)
    assert compute_epsilon([event], DELTA, "skellam_rdp_integer") == pytest.approx(
        rdp_to_epsilon(orders, curve, DELTA), rel=1e-12
    )
    # A new ledger names it, and verifies.
    _new_ledger(tmp_path / "ledger.jsonl", _config())
    entries = Ledger(tmp_path / "ledger.jsonl").entries
    assert {e["accountant"] for e in entries if entry_kind(e) == RELEASE} == {"skellam_rdp_integer"}
    assert verify_ledger(tmp_path / "ledger.jsonl").ok


def test_the_legacy_accountant_is_refused_for_new_runs():
    with pytest.raises(ConfigError, match=r"dp\.accountant = 'skellam_rdp': evaluates"):
        load_config(
            None,
            {
                "dp.mechanism": "distributed",
                "dp.epsilon": 8,
                "secagg.enabled": True,
                "dp.accountant": "skellam_rdp",
            },
        )
    with pytest.raises(ValueError, match=r"DpConfig\.accountant='skellam_rdp' is invalid"):
        _config(accountant="skellam_rdp")


@pytest.mark.parametrize(
    ("rounds", "q", "sampling", "fractional_was_short"),
    [
        (10, 1.0, "poisson", True),
        (40, 1.0, "poisson", True),
        (60, 0.2, "poisson", True),
        (30, 0.1, "fixed", False),  # its best order is an integer one either way
    ],
)
def test_calibration_meets_the_budget_at_integer_orders(rounds, q, sampling, fractional_was_short):
    neighbouring = "replace_one" if sampling == "fixed" else "zero_out"
    population = 100 if sampling == "fixed" else None

    def epsilon(z: float, accountant: str) -> float:
        event = PrivacyEvent(z, q, rounds, sampling, neighbouring, population)
        return compute_epsilon([event], DELTA, accountant)

    z = calibrate_noise_multiplier(
        8.0,
        DELTA,
        rounds,
        q,
        sampling=sampling,
        neighbouring=neighbouring,
        population_size=population,
        mechanism=SKELLAM,
    )
    assert epsilon(z, "skellam_rdp_integer") <= 8.0
    assert epsilon(z * 0.99, "skellam_rdp_integer") > 8.0  # not needlessly noisy
    # The z the fractional orders calibrated was too small: over budget at integer orders
    # (the asynchronous ledger: 7.9952 <= 8, which is 8.0015 at integer orders).
    legacy = optimize.brentq(lambda x: epsilon(x, "skellam_rdp") - 8.0, 0.05, 100, rtol=1e-12)
    if fractional_was_short:
        assert legacy < z
        assert epsilon(legacy, "skellam_rdp_integer") > 8.0


def test_async_distributed_dp_calibrates_at_integer_orders():
    from fedveil.server.engine.dp_from_config import async_dp_config

    cfg = load_config(
        None,
        {
            "data.num_clients": 50,
            "dp.mechanism": "distributed",
            "dp.epsilon": 8.0,
            "secagg.enabled": True,
        },
    )
    cfg.server.mode, cfg.server.max_participations = "async", 10
    config = async_dp_config(cfg, 50)
    assert config.accountant_name == "skellam_rdp_integer"
    event = PrivacyEvent(config.noise_multiplier, 1.0, 10, neighbouring=config.neighbouring)
    assert 7.9 < compute_epsilon([event], config.delta, "skellam_rdp_integer") <= 8.0
