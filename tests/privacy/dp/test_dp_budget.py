import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedveil.privacy.dp import BudgetExceededError, DpConfig, Ledger, PrivacyBudget


def config(**overrides):
    values = dict(
        mechanism="central_gaussian",
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=0.05,
        rounds=50,
        delta=1e-5,
        budget_epsilon=2.0,
        accountant="rdp",
    )
    values.update(overrides)
    return DpConfig(**values)


def release(budget, ledger, round_number, event):
    return budget.record_release(ledger, round_number=round_number, event=event, clip_norm=1.0)


def test_would_exceed_is_decided_before_the_round(tmp_path):
    cfg = config(noise_multiplier=1.0, sampling_rate=0.1, budget_epsilon=3.0)
    budget, ledger = PrivacyBudget(cfg), Ledger(tmp_path / "ledger.jsonl")
    released = 0
    while not budget.would_exceed(cfg.round_event()):
        released += 1
        release(budget, ledger, released, cfg.round_event())
    assert 0 < released < 200
    assert budget.spent() <= cfg.budget_epsilon < budget.epsilon_after(cfg.round_event())
    with pytest.raises(BudgetExceededError):
        release(budget, ledger, released + 1, cfg.round_event())
    assert len(Ledger(tmp_path / "ledger.jsonl")) == released  # nothing written


def test_restart_rebuilds_the_accountant_state_from_the_ledger(tmp_path):
    cfg = config()
    path = tmp_path / "ledger.jsonl"
    budget, ledger = PrivacyBudget(cfg), Ledger(path)
    for number in range(1, 8):
        release(budget, ledger, number, cfg.round_event(noise_multiplier=1.0 + number / 10))
    restarted = PrivacyBudget.from_ledger(cfg, Ledger(path).entries)
    assert restarted.spent() == pytest.approx(budget.spent())
    assert restarted.history == budget.history
    assert restarted.spent() == pytest.approx(Ledger(path).entries[-1]["epsilon"])
    with pytest.raises(ValueError, match="budget_epsilon"):
        PrivacyBudget.from_ledger(config(budget_epsilon=5.0), Ledger(path).entries)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyBudget.from_ledger(config(accountant="prv"), Ledger(path).entries)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    q=st.floats(0.005, 0.5),
    z=st.floats(0.5, 3.0),
    budget_epsilon=st.floats(0.2, 8.0),
    dropout_noise=st.lists(st.floats(0.7, 1.0), min_size=1, max_size=5),
    rounds=st.integers(1, 40),
)
def test_budget_check_never_records_epsilon_above_budget(
    tmp_path_factory, q, z, budget_epsilon, dropout_noise, rounds
):
    cfg = config(noise_multiplier=z, sampling_rate=q, budget_epsilon=budget_epsilon)
    ledger = Ledger(tmp_path_factory.mktemp("run") / "ledger.jsonl")
    budget = PrivacyBudget(cfg)
    for number in range(1, rounds + 1):
        # Effective z varies per round (e.g. distributed DP with dropouts).
        event = cfg.round_event(noise_multiplier=z * dropout_noise[number % len(dropout_noise)])
        if budget.would_exceed(event):
            break
        release(budget, ledger, number, event)
    epsilons = [entry["epsilon"] for entry in Ledger(ledger.path).entries]
    assert all(eps <= budget_epsilon for eps in epsilons)
    assert epsilons == sorted(epsilons)
