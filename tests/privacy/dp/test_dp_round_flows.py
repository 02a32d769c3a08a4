"""The call sequences the round engine uses, end to end without transport."""

import numpy as np
import pytest

from fedveil.privacy.dp import (
    DpConfig,
    Ledger,
    PrivacyBudget,
    SkellamEncoder,
    SkellamParams,
    add_gaussian_noise,
    build_report,
    clip_indicator,
    clip_l2,
    next_clip_norm,
    noised_count,
    render_html,
    verify_ledger,
)
from fedveil.privacy.dp.signing import load_or_create_signer


def test_central_dp_with_adaptive_clipping(tmp_path):
    cfg = DpConfig(
        mechanism="central_gaussian",
        noise_multiplier=1.0,
        clip_norm=0.1,
        sampling_rate=0.01,
        rounds=30,
        delta=1e-5,
        budget_epsilon=3.0,
        cohort_size=40,
        adaptive_clipping=True,
        accountant="rdp",
    )
    rng = np.random.default_rng(3)
    signer = load_or_create_signer()
    ledger = Ledger(tmp_path / "ledger.jsonl", run_id="central", signer=signer)
    budget = PrivacyBudget(cfg)
    clip, dim = cfg.clip_norm, 50
    for number in range(1, cfg.rounds + 1):
        event = cfg.round_event()
        if budget.would_exceed(event):
            break
        updates = [rng.normal(size=dim) for _ in range(cfg.cohort_size - number % 4)]
        total = sum(clip_l2(u, clip).astype(np.float64) for u in updates)  # secure sum
        count = sum(clip_indicator(u, clip) for u in updates)  # secure sum too
        noised = add_gaussian_noise(total, cfg.update_noise_multiplier, clip, rng=rng)
        noisy_count = noised_count(count, cfg.count_stddev, rng=rng)
        following = next_clip_norm(
            clip, noisy_count, cfg.cohort_size, cfg.target_quantile, cfg.clip_learning_rate
        )
        budget.record_release(
            ledger,
            round_number=number,
            event=event,
            clip_norm=clip,
            extra={"next_clip_norm": following},
        )
        _model_delta = noised / cfg.cohort_size  # released only after the entry is durable
        clip = following
        if number == 10:  # simulate a restart: state comes back from the ledger alone
            ledger.close("interrupted", {"training_round": number, "reason": "restart"})
            ledger = Ledger(ledger.path, run_id="central", signer=signer)
            budget = PrivacyBudget.from_ledger(cfg, ledger)
            clip = ledger.releases[-1]["next_clip_norm"]
    ledger.close("final", {"training_round": cfg.rounds, "epsilon": budget.spent()})
    entries = Ledger(ledger.path).releases
    assert len(entries) == cfg.rounds
    assert entries[-1]["clip_norm"] > 5 * cfg.clip_norm  # grew toward the median norm (~7)
    result = verify_ledger(ledger.path, expected_entries=len(entries) + 2)
    assert result.ok, result.message
    html = render_html(build_report(entries, verification=result))
    assert "Central DP" in html


def test_distributed_dp_accounts_for_the_survivors(tmp_path):
    cfg = DpConfig(
        mechanism="distributed_skellam",
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=0.02,
        rounds=5,
        delta=1e-5,
        # Room for 5 worst-case rounds at integer Renyi orders (5.61 at z = 1).
        budget_epsilon=6.0,
        cohort_size=12,
        modulus_bits=20,
    )
    params = SkellamParams.calibrate(
        dim=200,
        clip_norm=cfg.clip_norm,
        noise_multiplier=cfg.noise_multiplier,
        num_clients=cfg.cohort_size,
        min_clients=8,
        bits=cfg.modulus_bits,
    )
    ledger = Ledger(tmp_path / "ledger.jsonl", run_id="skellam", signer=load_or_create_signer())
    budget = PrivacyBudget(cfg)
    rng = np.random.default_rng(4)
    for number in range(1, cfg.rounds + 1):
        # Check with the worst case the round may end with: min_clients survivors.
        worst = cfg.round_event(params.noise_multiplier_for(params.min_clients))
        assert not budget.would_exceed(worst)
        encoder = SkellamEncoder(params, rotation_seed=1000 + number, rng=rng)
        survivors = [rng.normal(size=200) for _ in range(8 + number % 5)]
        modular_sum = np.mod(
            sum(encoder.encode(clip_l2(u, cfg.clip_norm)).astype(np.int64) for u in survivors),
            params.modulus,
        )
        decoded = encoder.decode(modular_sum, len(survivors))
        event = cfg.round_event(params.noise_multiplier_for(len(survivors)))
        budget.record_release(
            ledger,
            round_number=number,
            event=event,
            clip_norm=cfg.clip_norm,
            extra={"skellam": params.to_dict(), "noise_shares": len(survivors)},
        )
        assert decoded.shape == (200,)
    ledger.close("final", {"training_round": cfg.rounds, "epsilon": budget.spent()})
    entries = Ledger(ledger.path).releases
    assert len({entry["noise_multiplier"] for entry in entries}) > 1
    assert min(entry["noise_multiplier"] for entry in entries) == pytest.approx(1.0)
    assert verify_ledger(ledger.path).ok
