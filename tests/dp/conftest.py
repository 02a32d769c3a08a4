import pytest

from fedveil.privacy.dp import DpConfig, Ledger, PrivacyBudget


@pytest.fixture
def make_ledger(tmp_path):
    """Write a small, valid central-DP ledger and return (path, config, budget)."""

    def build(rounds=6, accountant="rdp", name="ledger.jsonl"):
        cfg = DpConfig(
            mechanism="central_gaussian",
            noise_multiplier=1.1,
            clip_norm=0.5,
            sampling_rate=0.05,
            rounds=rounds,
            delta=1e-5,
            budget_epsilon=10.0,
            cohort_size=20,
            accountant=accountant,
        )
        path = tmp_path / name
        ledger, budget = Ledger(path), PrivacyBudget(cfg)
        for number in range(1, rounds + 1):
            budget.record_release(
                ledger,
                round_number=number,
                event=cfg.round_event(),
                clip_norm=0.5 + 0.01 * number,
                cohort_planned=20,
                cohort_aggregated=20 - number % 3,
            )
        return path, cfg, budget

    return build
