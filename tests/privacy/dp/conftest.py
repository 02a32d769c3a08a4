import pytest

from fedveil.privacy.dp import DpConfig, Ledger, PrivacyBudget
from fedveil.privacy.dp.signing import load_or_create_signer


@pytest.fixture
def make_ledger(tmp_path):
    """Write a small, valid, signed central-DP ledger and return (path, config, budget).

    `close` ("final", "interrupted" or None) is the record that ends it; `opened`: it
    starts with the opening record (schema 3), else it is a schema-2 ledger.
    """

    def build(
        rounds=6, accountant="rdp", name="ledger.jsonl", close="final", run_id="run-1", opened=False
    ):
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
        ledger = Ledger(path, run_id=run_id, signer=load_or_create_signer())
        budget = PrivacyBudget(cfg)
        if opened:  # ledger schema 3: the signed opening record first
            ledger.open({"plan": {"mechanism": "central"}})
        for number in range(1, rounds + 1):
            budget.record_release(
                ledger,
                round_number=number,
                event=cfg.round_event(),
                clip_norm=0.5 + 0.01 * number,
                extra={"training_round": number},
            )
        if close == "final":
            ledger.close("final", {"training_round": rounds, "epsilon": budget.spent()})
        elif close == "interrupted":
            ledger.close("interrupted", {"training_round": rounds, "reason": "stopped"})
        return path, cfg, budget

    return build
