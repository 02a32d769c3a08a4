from __future__ import annotations

import pytest

from fedveil.config import ConfigError, RunConfig, load_config, to_toml


def test_defaults_are_the_documented_default_job():
    cfg = load_config()
    assert cfg.data.dataset == "fashion-mnist"
    assert cfg.data.num_clients == 100
    assert cfg.data.partition == "dirichlet" and cfg.data.alpha == 0.5
    assert cfg.server.per_round == 20
    assert cfg.model.name == "cnn"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"server.rounds": -1}, "server.rounds = -1: must be >= 1"),
        ({"data.alpha": 0}, "data.alpha = 0.0: must be > 0.0"),
        ({"data.alpha": -0.5}, "data.alpha = -0.5: must be > 0.0"),
        ({"server.per_round": 200}, "server.per_round = 200: more sampled clients than exist"),
        ({"transport": "grpc"}, "transport = 'grpc': must be one of inprocess, flower"),
        ({"server.rounds": "ten"}, "server.rounds = 'ten': must be an integer"),
        ({"client.lr": "nan"}, "client.lr = nan: must be a finite number"),
        ({"server.sample_rate": 1.5}, "server.sample_rate = 1.5: must be <= 1.0"),
        ({"server.bogus": 1}, "unknown key server.bogus"),
        ({"model.task": "no_colon"}, "model.task = 'no_colon': must look like"),
        ({"eval.federated_every": 2}, "needs eval.client_holdout > 0"),
    ],
)
def test_bad_values_name_the_field_and_limit(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert fragment in str(err.value)


def test_toml_file_and_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("seed = 7\n[server]\nrounds = 3\nper_round = 5\n[data]\nnum_clients = 10\n")
    cfg = load_config(path, {"server.rounds": "4"})
    assert (cfg.seed, cfg.server.rounds, cfg.server.per_round) == (7, 4, 5)


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = load_config(None, {"data.num_clients": 10, "server.per_round": 3, "seed": 5})
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[server]\nrounds = " + b"9" * 5000 + b"\n", "4300 digits"),
        (b"[server]\nrounds = 3\n# \xff\n", "utf-8"),
    ],
)
def test_a_config_past_the_parsers_limits_is_a_config_error(tmp_path, content, says):
    # Both were a ValueError from inside the parser: the file was not named.
    from fedveil.server.coordinator.settings import load_settings

    bad = tmp_path / "bad.toml"
    bad.write_bytes(content)
    for load in (load_config, load_settings):
        with pytest.raises(ConfigError, match=f"--config {bad}: not valid TOML .*{says}"):
            load(bad)


def test_poisson_rate_defaults_to_expected_cohort():
    cfg = load_config(None, {"server.sampling": "poisson"})
    assert isinstance(cfg, RunConfig)
    assert cfg.poisson_rate == pytest.approx(20 / 100)


DISTRIBUTED = {
    "data.num_clients": 50,
    "server.per_round": 10,
    "secagg.enabled": True,
    "dp.mechanism": "distributed",
    "dp.epsilon": 8.0,
    "eval.client_holdout": 0.2,
}
ASYNC = {"server.buffer": 5, "server.group_size": 5, "server.max_participations": 8}


@pytest.mark.parametrize("mode", ["sync", "async", "ssp"])
def test_federated_evaluation_is_refused_under_distributed_dp(mode):
    # Each client's accuracy and loss would reach the coordinator un-noised, outside the
    # epsilon stated against it; central DP trusts the coordinator, so it stays allowed.
    values = DISTRIBUTED | ({} if mode == "sync" else {"server.mode": mode, **ASYNC})
    assert load_config(None, values).eval.federated_every == 0
    with pytest.raises(ConfigError) as err:
        load_config(None, values | {"eval.federated_every": 2})
    message = str(err.value)
    assert message.startswith("eval.federated_every = 2 with dp.mechanism = 'distributed'")
    assert "in the clear" in message and "does not cover" in message
    assert "eval.federated_every = 0" in message and "dp.mechanism = 'central'" in message
    central = load_config(None, values | {"eval.federated_every": 2, "dp.mechanism": "central"})
    assert central.eval.federated_every == 2


def test_fedveil_simulate_refuses_federated_evaluation_under_distributed_dp(capsys):
    from fedveil.cli.main import main

    code = main(
        [
            *("simulate", "--secagg", "--dp", "distributed", "--epsilon", "8"),
            *("--set", "eval.federated_every=1", "--set", "eval.client_holdout=0.2"),
        ]
    )
    assert code == 2
    assert "eval.federated_every = 1 with dp.mechanism = 'distributed'" in capsys.readouterr().err
