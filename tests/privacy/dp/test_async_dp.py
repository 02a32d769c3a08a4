"""DP under asynchronous participation (issue 21): no amplification, a per-client cap.

Each test plays the adversary or the auditor: a client pushed past its cap, an operator
who edits or re-signs the ledger, a config whose cap cannot be afforded.
"""

from __future__ import annotations

import json

import pytest
from opacus.accountants import PRVAccountant, RDPAccountant
from test_ledger_signing import write_chain

from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp import Ledger, PrivacyBudget, build_report
from fedveil.privacy.dp.async_plan import stated_bound
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.dp.ledger import RELEASE, entry_kind
from fedveil.privacy.dp.participation import (
    ParticipationCap,
    ParticipationCapError,
    cap_bound,
    capped_events,
    participation_bound,
)
from fedveil.privacy.dp.report import headline_lines
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.server.engine.dp_from_config import async_dp_config

DELTA = 1e-5


def async_config(mode: str = "async", cap: int = 4, **dp: object):
    """A DP run config put in an asynchronous mode (the config loader's own async checks
    are tested with the engine; here the DP layer must refuse on its own)."""
    values = {"data.num_clients": 50, "dp.mechanism": "central", "dp.epsilon": 8.0}
    values.update({f"dp.{k}": v for k, v in dp.items()})
    cfg = load_config(None, values)
    cfg.server.mode = mode
    cfg.server.max_participations = cap
    return cfg


# -- the accountant: Opacus' own figure for q = 1 and P steps ------------------------


@pytest.mark.parametrize(("z", "cap"), [(0.8, 1), (1.1, 5), (2.0, 40)])
def test_the_cap_bound_is_opacus_rdp_for_q1_and_p_steps(z, cap):
    ours = cap_bound(PrivacyEvent(z, 1.0, neighbouring="zero_out"), cap, DELTA, "rdp")
    opacus = RDPAccountant()
    opacus.history = [(z, 1.0, cap)]
    assert ours == pytest.approx(opacus.get_epsilon(DELTA), rel=1e-12)


def test_prv_is_opacus_prv_too():
    ours = cap_bound(PrivacyEvent(1.3, 1.0, neighbouring="zero_out"), 6, DELTA, "prv")
    opacus = PRVAccountant()
    opacus.history = [(1.3, 1.0, 6)]
    assert ours == pytest.approx(opacus.get_epsilon(DELTA), rel=1e-9)


def test_a_client_composes_only_its_capped_releases():
    event = PrivacyEvent(1.0, 1.0, neighbouring="zero_out")
    fifty = [event] * 50
    assert participation_bound(fifty, 5, DELTA, "rdp") == cap_bound(event, 5, DELTA, "rdp")
    # Fewer releases than the cap: only those.
    assert participation_bound(fifty[:3], 5, DELTA, "rdp") == cap_bound(event, 3, DELTA, "rdp")
    # Mixed noise: the cap's worst case is the least-noisy releases.
    noisy = PrivacyEvent(4.0, 1.0, neighbouring="zero_out")
    picked = capped_events([noisy, event, noisy, event], 2)
    assert [e.noise_multiplier for e in picked] == [1.0, 1.0]
    # An event standing for several releases is cut to what the cap allows.
    assert (
        capped_events([PrivacyEvent(1.0, 1.0, steps=9, neighbouring="zero_out")], 2)[0].steps == 2
    )


# -- the dispatch gate ---------------------------------------------------------------


def test_a_client_can_never_be_dispatched_past_its_cap():
    gate = ParticipationCap(3)
    for _ in range(3):
        gate.dispatch(7)
    assert not gate.admits(7)
    assert gate.eligible([7, 8]) == [8]
    with pytest.raises(ParticipationCapError, match="max_participations = 3"):
        gate.dispatch(7)
    assert gate.count(7) == 3  # the refused dispatch was not counted


def test_a_resumed_gate_remembers_the_dispatches_and_refuses_an_overfull_history():
    gate = ParticipationCap(2, {5: 2, 6: 1})
    assert gate.eligible([5, 6, 7]) == [6, 7]
    with pytest.raises(ParticipationCapError):
        ParticipationCap(2, {5: 3})
    with pytest.raises(ValueError, match=r"server\.max_participations = 0"):
        ParticipationCap(0)


# -- refusals: accounting that cannot be stated, or cannot be afforded --------------


def test_async_dp_without_a_cap_is_refused_and_says_why():
    with pytest.raises(
        ConfigError,
        match=r"needs a cap: server\.max_participations = 0, must be >= 1.*compose without bound",
    ):
        async_dp_config(async_config(cap=0), 50)


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_distributed_dp_under_async_is_accounted_per_group_with_the_skellam_curve(mode):
    # Each group release is one unsampled Skellam release: skellam_rdp_integer, the only sound
    # accountant, composed over the cap (tests/engine/test_async_distributed_dp.py runs it).
    cfg = async_config(mode, cap=5)
    cfg.dp.mechanism = "distributed"
    cfg.secagg.enabled = True
    config = async_dp_config(cfg, 50)
    assert (config.mechanism, config.accountant_name) == (
        "distributed_skellam",
        "skellam_rdp_integer",
    )
    assert (config.sampling_rate, config.max_participations) == (1.0, 5)
    assert 7.99 <= stated_bound(config) <= 8.0


def test_adaptive_clipping_and_add_remove_are_refused_under_async():
    with pytest.raises(ConfigError, match=r"dp\.adaptive_clip"):
        async_dp_config(async_config(adaptive_clip=True), 50)
    with pytest.raises(ConfigError, match=r"dp\.neighbouring = 'add_remove'"):
        async_dp_config(async_config(neighbouring="add_remove"), 50)


def test_a_cap_the_budget_cannot_afford_is_refused_before_the_run():
    cfg = async_config(cap=50, noise_multiplier=0.7, epsilon=2.0)
    with pytest.raises(
        ConfigError,
        match=r"dp\.noise_multiplier = 0\.7 with server\.max_participations = 50.* > dp\.epsilon",
    ):
        async_dp_config(cfg, 50)


def test_z_zero_is_calibrated_to_the_cap_and_budget():
    config = async_dp_config(async_config(cap=10, noise_multiplier=0.0, epsilon=4.0), 50)
    assert (config.sampling_rate, config.max_participations) == (1.0, 10)
    assert (config.neighbouring, config.accountant_name) == ("zero_out", "rdp")
    bound = stated_bound(config)
    assert 3.99 <= bound <= 4.0
    opacus = RDPAccountant()
    opacus.history = [(config.noise_multiplier, 1.0, 10)]
    assert bound == pytest.approx(opacus.get_epsilon(DELTA), rel=1e-12)


def test_sync_mode_is_untouched():
    cfg = async_config(mode="sync", cap=0)
    from fedveil.config.async_dp import check_async_dp

    check_async_dp(cfg)  # nothing to refuse: sync keeps its own accounting


# -- the ledger: releases past the cap, verify, tampering, the public report --------


def capped_run(path, releases=12, cap=4, close=True):
    config = async_dp_config(async_config(cap=cap, noise_multiplier=2.0, epsilon=8.0), 50)
    ledger = Ledger(path, run_id="async-run", signer=load_or_create_signer())
    budget = PrivacyBudget(config)
    for version in range(1, releases + 1):
        budget.record_release(
            ledger,
            round_number=version,
            event=config.round_event(),
            clip_norm=config.clip_norm,
            extra={"training_round": version},
        )
    if close:
        ledger.close("final", {"training_round": releases, "epsilon": budget.spent()})
    return config, ledger, budget


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_releases_past_the_cap_do_not_grow_the_public_epsilon_and_verify_recomputes_it(tmp_path):
    config, ledger, _ = capped_run(tmp_path / "ledger.jsonl", releases=12, cap=4)
    epsilons = [e["epsilon"] for e in ledger.releases]
    assert epsilons[3:] == [stated_bound(config)] * 9  # from the 4th release on: the bound
    assert epsilons[0] < epsilons[1] < epsilons[2] < epsilons[3]
    result = verify_ledger(tmp_path / "ledger.jsonl")
    assert result.ok, result.message
    assert result.final_epsilon == pytest.approx(stated_bound(config))


def test_a_restart_cannot_change_the_cap(tmp_path):
    capped_run(tmp_path / "ledger.jsonl", close=False)
    other = async_dp_config(async_config(cap=5, noise_multiplier=2.0, epsilon=8.0), 50)
    with pytest.raises(ValueError, match="max_participations=4 but the config says 5"):
        PrivacyBudget.from_ledger(other, Ledger(tmp_path / "ledger.jsonl").releases)


def test_verify_fails_on_a_tampered_ledger(tmp_path):
    path = tmp_path / "ledger.jsonl"
    capped_run(path, releases=8, cap=4)
    signer = load_or_create_signer()
    entries = read(path)

    # 1. An edited cap without re-signing: the signature no longer matches.
    edited = [dict(e) for e in entries]
    edited[2]["max_participations"] = 1
    path.write_text("".join(json.dumps(e) + "\n" for e in edited))
    assert not verify_ledger(path).ok

    # 2. Re-signed with the operator's own key, a smaller cap claimed on every release:
    #    the recorded epsilons (a client in 4 releases) no longer match a cap of 2.
    smaller = [dict(e) for e in entries]
    for e in smaller:
        if entry_kind(e) == RELEASE:
            e["max_participations"] = 2
    write_chain(path, smaller, signer)
    result = verify_ledger(path)
    assert not result.ok and "differs from the recomputed" in result.message

    # 3. The cap removed and the chain re-signed: every release would compose, 8 > 4.
    uncapped = [dict(e) for e in entries]
    for e in uncapped:
        e.pop("max_participations", None)
    write_chain(path, uncapped, signer)
    result = verify_ledger(path)
    assert not result.ok and "differs from the recomputed" in result.message

    # 4. The cap raised half-way (a resume with a bigger cap), re-signed.
    raised = [dict(e) for e in entries]
    for e in raised[5:]:
        if entry_kind(e) == RELEASE:
            e["max_participations"] = 6
    write_chain(path, raised, signer)
    result = verify_ledger(path)
    assert not result.ok and "max_participations changed" in result.message


def test_the_public_report_shows_the_bound_not_counts(tmp_path):
    config, ledger, _ = capped_run(tmp_path / "ledger.jsonl", releases=6, cap=4)
    report = build_report(ledger.entries, verification=verify_ledger(tmp_path / "ledger.jsonl"))
    assert report["participation"]["max_participations"] == 4
    assert report["participation"]["epsilon_cap_bound"] == pytest.approx(stated_bound(config))
    assert report["epsilon"] == pytest.approx(stated_bound(config))
    assert report["adversaries"]["observers"]["amplified_by_sampling"] is False
    assert "no amplification" in report["sampling_statement"]
    text = json.dumps(report)
    for private in ("dispatches", "participations_max", "realised", "client_counts"):
        assert private not in text
    assert any("at most 4 releases" in line for line in headline_lines(report))


def test_the_noise_warning_counts_the_buffer_not_a_cohort():
    from fedveil.server.engine.dp_from_config import noise_to_signal

    cfg = async_config(cap=10, noise_multiplier=3.0, epsilon=8.0)
    cfg.server.buffer = 2
    signal = noise_to_signal(cfg, 50)
    assert signal is not None and signal.expected_cohort == 2
    assert "Raise server.buffer" in (signal.warning() or "")
    cfg.server.max_participations = 500  # unaffordable at z = 3: refused, not warned
    with pytest.raises(ConfigError, match=r"server\.max_participations = 500"):
        noise_to_signal(cfg, 50)


BOUND = "epsilon_coordinator_bound"


def distributed_group_run(path, releases=6, cap=2):
    """A ledger as the asynchronous distributed-DP stage writes it: one release per group,
    its Skellam parameters and the coordinator's (capped) bound on every entry."""
    from fedveil.privacy.dp.adversaries import coordinator_bound_after
    from fedveil.server.engine.dp_from_config import plan_distributed_dp

    cfg = async_config(cap=cap)
    cfg.dp.mechanism = "distributed"
    cfg.secagg.enabled = True
    cfg.server.group_size = 5
    config = async_dp_config(cfg, 50)
    plan = plan_distributed_dp(cfg, 100, 50)
    event = config.round_event(plan.noise_multiplier)
    ledger = Ledger(path, run_id="async-group-run", signer=load_or_create_signer())
    budget = PrivacyBudget(config)
    for number in range(1, releases + 1):
        bound = coordinator_bound_after(ledger.releases, config.delta, [event], cap)
        extra = {"skellam": plan.params.to_dict(), "noise_shares": plan.min_honest}
        budget.record_release(
            ledger,
            round_number=number,
            event=event,
            clip_norm=config.clip_norm,
            extra={**extra, "epsilon_coordinator_bound": bound},
        )
    bound = coordinator_bound_after(ledger.releases, config.delta)
    ledger.close("final", {"training_round": 3, "epsilon": budget.spent(), BOUND: bound})
    return config, plan, ledger


def test_the_coordinators_bound_under_a_cap_is_p_releases_and_verify_recomputes_it(tmp_path):
    path = tmp_path / "ledger.jsonl"
    config, plan, ledger = distributed_group_run(path, releases=6, cap=2)
    bound = stated_bound(config, plan.noise_multiplier)
    entries = read(path)
    assert [e[BOUND] for e in entries][1:] == pytest.approx([bound] * 6)  # from the 2nd on
    result = verify_ledger(path)
    assert result.ok, result.message
    assert result.final_epsilon == pytest.approx(bound)
    report = build_report(ledger.entries, verification=result)
    assert report["adversaries"]["coordinator"]["epsilon_bound"] == pytest.approx(bound)
    assert "a client in 2 releases" in report["adversaries"]["coordinator"]["bound"]
    # A forger who states a smaller bound and re-signs the chain is caught by recomputing.
    lowered = [dict(e) for e in entries]
    lowered[-1][BOUND] = bound / 2
    write_chain(path, lowered, load_or_create_signer())
    result = verify_ledger(path)
    assert not result.ok and f"states {BOUND}" in result.message
