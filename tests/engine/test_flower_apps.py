"""fedveil.flower: the run config a Flower app gives, and fedveil's own pair of apps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.simulation import run_simulation
from local_ray import local_ray

from fedveil.config import ConfigError, load_config
from fedveil.flower import client_app, run_config_of, server_app


def test_run_config_of_reads_a_path_and_flattened_keys(tmp_path):
    path = tmp_path / "fedveil.toml"
    path.write_text("seed = 7\n[server]\nrounds = 9\nper_round = 2\n")
    cfg = run_config_of(
        {
            "fedveil-config": str(path),
            "server.rounds": 2,  # [tool.flwr.app.config] server.rounds, as Flower flattens it
            "fedveil.data.num_clients": 5,  # namespaced among the app's own keys
            "num-server-rounds": 30,  # the app's own key: not fedveil's, ignored
            "lr": 0.5,
        }
    )
    assert (cfg.seed, cfg.server.rounds, cfg.server.per_round) == (7, 2, 2)
    assert cfg.data.num_clients == 5 and cfg.client.lr == load_config().client.lr


def test_run_config_of_names_a_misspelt_fedveil_key():
    with pytest.raises(ConfigError, match=r"server\.roundz"):
        run_config_of({"server.roundz": 3})


@pytest.mark.flower
@pytest.mark.slow
def test_fedveil_client_app_under_fedveil_server_app(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 4,
            "server.per_round": 4,
            "server.rounds": 2,
            "device": "cpu",
            "out": str(tmp_path / "run"),
        },
    )
    local_ray()
    run_simulation(
        server_app=server_app(cfg),
        client_app=client_app(cfg),
        num_supernodes=4,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["rounds_applied"] == 2 and summary["first_client_error"] is None
    assert (Path(cfg.out) / "model.safetensors").exists()
