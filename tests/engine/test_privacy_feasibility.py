"""Issue 18: secure aggregation that cannot reach its threshold is refused before any data
is loaded, and DP noise that swamps the averaged update is stated and warned about."""

from __future__ import annotations

import pytest

import tiny_task
from fedveil.cli.main import main
from fedveil.config import ConfigError, load_config
from fedveil.server.engine.dp_from_config import check_secagg_feasible, noise_to_signal
from fedveil.server.engine.pipeline import make_privacy_pipeline

# A data directory that does not exist: reaching the data loader would fail differently.
NO_DATA = ["--set", "data.dataset=fashion-mnist", "--set", "data.data_dir=/nonexistent/fv"]


def simulate(tmp_path, capsys, *args: str) -> tuple[int, str]:
    argv = ["simulate", "--rounds", "1", "--out", str(tmp_path / "run"), *NO_DATA, *args]
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_simulate_refuses_a_two_client_secure_round_before_loading_data(tmp_path, capsys):
    rc, err = simulate(
        tmp_path, capsys, "--clients", "2", "--per-round", "2", "--set", "secagg.enabled=true"
    )
    assert rc == 2
    assert "server.per_round = 2: secure aggregation needs at least 3 clients" in err
    assert "nonexistent" not in err  # refused before the data was looked for
    assert not (tmp_path / "run").exists()


def test_simulate_refuses_a_poisson_cohort_expected_below_three(tmp_path, capsys):
    rc, err = simulate(
        tmp_path,
        capsys,
        "--clients",
        "100",
        "--set",
        "server.sampling=poisson",
        "--set",
        "server.sample_rate=0.02",
        "--set",
        "secagg.enabled=true",
    )
    assert rc == 2
    assert "server.sample_rate = 0.02: secure aggregation needs at least 3 clients" in err
    assert "expected Poisson cohort of 2" in err


def test_the_engine_refuses_it_too(tmp_path):
    """A config that bypasses the CLI (the deployed ServerApp, a library caller)."""
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 2,
            "secagg.enabled": True,
            "out": str(tmp_path / "run"),
        },
    )
    with pytest.raises(ConfigError, match=r"^server\.per_round = 2: secure aggregation"):
        make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "ledger.jsonl")


def test_distributed_dp_needs_its_survivor_floor_and_enough_devices_waited_for():
    base = {
        "data.num_clients": 20,
        "server.per_round": 10,
        "secagg.enabled": True,
        "dp.mechanism": "distributed",
        "dp.epsilon": 8.0,
        "dp.noise_multiplier": 1.0,
    }
    cfg = load_config(None, base)
    check_secagg_feasible(cfg, 20)  # a cohort of 10 is fine
    with pytest.raises(ConfigError, match=r"^deploy\.wait_for_clients = 3: distributed DP"):
        check_secagg_feasible(cfg, 20, wait_for_clients=3)
    check_secagg_feasible(cfg, 20, wait_for_clients=10)
    plain = load_config(None, {**base, "dp.mechanism": "none"})
    with pytest.raises(ConfigError, match=r"^deploy\.wait_for_clients = 2: secure agg"):
        check_secagg_feasible(plain, 20, wait_for_clients=2)
    check_secagg_feasible(plain, 20, wait_for_clients=3)


def test_noise_to_signal_is_z_over_the_expected_cohort():
    cfg = load_config(
        None,
        {
            "data.num_clients": 3,
            "server.per_round": 3,
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "dp.noise_multiplier": 1.34,
            "dp.clip": 2.0,
        },
    )
    signal = noise_to_signal(cfg, 3)
    assert signal is not None
    assert signal.noise_std == pytest.approx(1.34 * 2.0 / 3)
    assert signal.ratio == pytest.approx(1.34 / 3)
    assert signal.dominates
    many = load_config(
        None,
        {
            "data.num_clients": 1000,
            "server.per_round": 500,
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "dp.noise_multiplier": 1.0,
        },
    )
    assert not noise_to_signal(many, 1000).dominates


def test_simulate_warns_with_the_numbers_when_noise_dominates(tmp_path, capsys):
    # The case: 3 devices, z = 1.34, central DP.
    rc, err = simulate(
        tmp_path,
        capsys,
        "--clients",
        "3",
        "--per-round",
        "3",
        "--set",
        "dp.mechanism=central",
        "--set",
        "dp.epsilon=8",
        "--set",
        "dp.noise_multiplier=1.34",
    )
    warning = next(line for line in err.splitlines() if "warning: DP noise" in line)
    assert "1.34*1/3 = 0.447" in warning and "outweighs" in warning
    assert rc == 2  # then the (absent) data stops it: the warning came first
