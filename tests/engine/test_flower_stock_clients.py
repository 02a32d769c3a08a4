"""Stock Flower ClientApps in a fedveil run (issue 19), on Flower's real simulation engine.

The clients are tests/flower_quickstart_app.py: an `@app.train()` app written as in
Flower's quickstart, with no fedveil import, and a legacy NumPyClient app. The server is
fedveil's (`fedveil.flower.server_app`), its model the same torch Net (the task in
tests/flower_quickstart_task.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import flower_quickstart_app as quickstart
import pytest
import torch
from flwr.simulation import run_simulation
from local_ray import local_ray
from safetensors.torch import load_file

from fedveil.config import RunConfig, load_config
from fedveil.flat_model import FlatModel
from fedveil.flower import server_app
from fedveil.server.engine.flower_stock_codec import MIGRATION_GUIDE
from fedveil.server.engine.rounds import initial_model
from fedveil.tasks import make_server_task

pytestmark = [pytest.mark.flower, pytest.mark.slow]

CLIENTS = 4


def _config(tmp_path: Path, **overrides: object) -> RunConfig:
    values = {
        "model.task": "flower_quickstart_task:make",
        "data.num_clients": CLIENTS,
        "server.per_round": CLIENTS,
        "server.rounds": 3,
        "client.lr": 0.1,
        "device": "cpu",
        "simulation.plots": False,
        "out": str(tmp_path / "run"),
        **overrides,
    }
    return load_config(None, values)


def _simulate(cfg: RunConfig, client_app: object) -> None:
    local_ray()
    run_simulation(
        server_app=server_app(cfg),
        client_app=client_app,
        num_supernodes=CLIENTS,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )


def _initial(cfg: RunConfig) -> tuple[FlatModel, torch.Tensor]:
    model = FlatModel(initial_model(make_server_task(cfg), cfg.seed))
    return model, model.get()


def _final(cfg: RunConfig, model: FlatModel) -> torch.Tensor:
    return model.vector_from(load_file(str(Path(cfg.out) / "model.safetensors")))


def test_stock_quickstart_client_trains_in_a_fedveil_run(tmp_path):
    # Federated evaluation in the last round: the stock app's @app.evaluate() answers it.
    federated = {"eval.federated_every": 3, "eval.client_holdout": 0.1}
    cfg = _config(tmp_path, **{**federated, "eval.federated_clients": CLIENTS})
    model, before = _initial(cfg)
    x, y = quickstart.test_data()
    initial_loss, _ = quickstart.test_fn(model.module, x, y)

    _simulate(cfg, quickstart.app)

    rows = [json.loads(line) for line in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
    assert [r["cohort_aggregated"] for r in rows] == [CLIENTS] * 3
    assert rows[-1]["test_loss"] < rows[0]["test_loss"] < initial_loss
    assert rows[-1]["test_accuracy"] > 0.8
    assert rows[0]["train_loss"] > 0  # the stock client's train_loss metric
    assert rows[-1]["federated_accuracy"] > 0.8 and rows[-1]["federated_loss"] > 0
    after = _final(cfg, model)
    assert not torch.equal(after, before)
    # The BatchNorm buffers travelled too: the clients' running statistics reached the model.
    saved = load_file(str(Path(cfg.out) / "model.safetensors"))
    assert not torch.equal(saved["bn.running_mean"], torch.zeros(16))
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["rounds_applied"] == 3 and summary["first_client_error"] is None


def test_stock_client_under_central_dp_is_clipped_by_the_server(tmp_path):
    clip = 0.05
    cfg = _config(
        tmp_path,
        **{
            "server.rounds": 1,
            "dp.mechanism": "central",
            "dp.clip": clip,
            "dp.noise_multiplier": 0.03,
            "dp.epsilon": 1e4,
        },
    )
    model, before = _initial(cfg)
    # What one stock client sends back, unclipped: far beyond the clip norm.
    trained = quickstart.Net()
    trained.load_state_dict(model.module.state_dict())
    quickstart.train_fn(trained, *quickstart.load_data(0), epochs=1, lr=0.1)
    raw = FlatModel(trained).get() - before
    assert raw.norm() > 10 * clip

    _simulate(cfg, quickstart.app)

    update = _final(cfg, model) - before
    # The mean of clipped updates (weight 1 each) has norm <= C; the noise adds ~12%.
    assert 0 < update.norm() <= 1.3 * clip


def test_stock_client_in_a_secure_aggregation_run_is_refused(tmp_path):
    cfg = _config(tmp_path, **{"secagg.enabled": True, "server.rounds": 1})
    with pytest.raises(RuntimeError, match="stock ClientApp") as err:
        _simulate(cfg, quickstart.app)
    assert "secure aggregation" in str(err.value)
    assert f"{CLIENTS} of {CLIENTS} Flower nodes" in str(err.value)


def test_legacy_numpy_client_is_refused_with_the_migration_guide(tmp_path):
    cfg = _config(tmp_path, **{"server.rounds": 1})
    with pytest.raises(RuntimeError, match="legacy ClientApp") as err:
        _simulate(cfg, quickstart.legacy_app)
    assert MIGRATION_GUIDE in str(err.value)
