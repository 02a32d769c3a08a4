import pytest

from fedveil.privacy.dp import DpConfig


def base(**overrides):
    values = dict(
        mechanism="central_gaussian",
        noise_multiplier=1.0,
        clip_norm=0.5,
        sampling_rate=0.01,
        rounds=100,
        delta=1e-5,
        budget_epsilon=3.0,
    )
    values.update(overrides)
    return DpConfig(**values)


def test_valid_config_resolves_the_tightest_accountant():
    assert base().accountant_name == "pld"
    # Distributed DP: auto resolves to zero-out adjacency and the general-bound RDP.
    skellam = base(mechanism="distributed_skellam")
    assert (skellam.neighbouring, skellam.accountant_name) == ("zero_out", "skellam_rdp_integer")
    fixed = base(
        sampling="fixed",
        neighbouring="replace_one",
        population_size=1000,
        cohort_size=10,
        sampling_rate=0.01,
    )
    assert fixed.accountant_name == "dpa_rdp"
    assert fixed.round_event().sample_size == 10
    assert DpConfig.from_dict(fixed.to_dict()) == fixed


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(mechanism="laplace"), "mechanism"),
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(noise_multiplier=float("inf")), "noise_multiplier"),
        (dict(clip_norm=-1.0), "clip_norm"),
        (dict(sampling_rate=1.5), "sampling_rate"),
        (dict(rounds=0), "rounds"),
        (dict(delta=1.0), "delta"),
        (dict(budget_epsilon=0), "budget_epsilon"),
        (dict(privacy_unit="example"), "privacy_unit"),
        (dict(mechanism="dp_sgd"), "privacy_unit"),
        (dict(sampling="systematic"), "sampling"),
        (dict(neighbouring="swap"), "neighbouring"),
        (
            dict(sampling="fixed", neighbouring="add_remove", population_size=1000, cohort_size=10),
            "neighbouring",
        ),
        (dict(sampling="fixed", neighbouring="replace_one", cohort_size=10), "population_size"),
        (
            dict(
                sampling="fixed", neighbouring="replace_one", population_size=1000, cohort_size=20
            ),
            "sampling_rate",
        ),
        (dict(accountant="prv", neighbouring="replace_one"), "accountant"),
        (dict(accountant="moments"), "accountant"),
        (dict(population_size=1000, delta=0.01), "delta"),
        (dict(modulus_bits=30), "modulus_bits"),
        (dict(steps_per_round=5), "steps_per_round"),
        (dict(adaptive_clipping=True), "cohort_size"),
        (dict(adaptive_clipping=True, cohort_size=20), "noise_multiplier"),
        (dict(adaptive_clipping=True, cohort_size=100, target_quantile=1.0), "target_quantile"),
    ],
)
def test_invalid_values_name_field_value_and_allowed_range(overrides, field):
    with pytest.raises(ValueError) as error:
        base(**overrides)
    message = str(error.value)
    assert f"DpConfig.{field}=" in message
    assert "allowed" in message


def test_adaptive_clipping_splits_the_noise():
    config = base(adaptive_clipping=True, cohort_size=100)
    assert config.count_stddev == 5.0
    assert config.update_noise_multiplier > config.noise_multiplier
