"""The coordinator's task: the test set and the model of a built-in task, no simulated clients."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from fedveil.config import load_config
from fedveil.data import partition as partition_module
from fedveil.server.engine.rounds import RoundEngine
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.simulate_run import simulate
from fedveil.tasks import make_server_task, make_task, split_test_data


def digits_config(tmp_path, **extra):
    overrides = {
        "data.dataset": "digits",
        "data.num_clients": 6,
        "data.partition": "dirichlet",
        "model.name": "mlp",
        "server.per_round": 3,
        "server.rounds": 2,
        "simulation.workers": 1,
        "simulation.vmap_clients": 1,  # one client at a time: the deployed client's arithmetic
        "simulation.plots": False,
        "seed": 3,
        "out": str(tmp_path / "sim"),
    }
    overrides.update(extra)
    return load_config(None, overrides)


def test_the_coordinator_splits_no_training_set_among_clients(tmp_path, monkeypatch):
    cfg = digits_config(tmp_path)
    simulated = make_task(cfg)

    def no_partition(*args, **kwargs):
        raise AssertionError("the coordinator partitioned the training set")

    monkeypatch.setattr(partition_module, "partition", no_partition)
    task = make_server_task(cfg)
    assert task.client_sizes is None and not task.info
    assert (task.name, task.num_clients, task.num_classes, task.input_shape) == (
        simulated.name,
        simulated.num_clients,
        simulated.num_classes,
        simulated.input_shape,
    )
    assert task.test_data is not None and simulated.test_data is not None
    assert all(torch.equal(a, b) for a, b in zip(task.test_data, simulated.test_data, strict=True))
    with pytest.raises(RuntimeError, match="client 2: the coordinator holds no training data"):
        task.client_data(2)


def test_a_naturally_split_dataset_has_the_configured_population(tmp_path):
    cfg = digits_config(tmp_path, **{"data.dataset": "synthetic", "data.num_clients": 7})
    task, simulated = make_server_task(cfg), make_task(cfg)
    assert task.num_clients == simulated.num_clients == 7
    assert task.test_data is not None and simulated.test_data is not None
    assert torch.equal(task.test_data[0], simulated.test_data[0])


def test_an_engine_on_the_server_task_reaches_the_simulations_model(tmp_path):
    # The coordinator's engine sees only the server task; the clients train on their own
    # data (here the simulation's partition). The model is the simulation's, bit for bit.
    cfg = digits_config(tmp_path)
    summary = simulate(cfg)
    simulated = load_file(f"{cfg.out}/model.safetensors")
    with InProcessTransport(make_task(cfg), run_config=cfg) as transport:
        engine = RoundEngine(cfg, make_server_task(cfg), transport)
        deployed = engine.run()
    weights = engine.model.named_tensors(engine.weights.detach().cpu())
    assert weights.keys() == simulated.keys()
    assert all(torch.equal(weights[k], simulated[k]) for k in weights)
    assert deployed["test_accuracy"] == summary["test_accuracy"]


def test_eval_split_halves_the_test_set_into_disjoint_validation_and_test(tmp_path):
    """eval.split: tuning reads the validation half, reporting the test half; they are
    disjoint and together the whole test set (the permutation is fixed, not the run seed's:
    a dataset with a fixed test set, Fashion-MNIST, gets the same halves in every run)."""
    task = make_task(digits_config(tmp_path))
    n = len(task.test_data[1])
    numbered = dataclasses.replace(task, test_data=(torch.arange(n).unsqueeze(1), torch.arange(n)))
    val = split_test_data(numbered, "validation").test_data[1].tolist()
    test = split_test_data(numbered, "test").test_data[1].tolist()
    assert not set(val) & set(test) and sorted(val + test) == list(range(n))
    assert split_test_data(numbered, "all") is numbered
    got = make_task(digits_config(tmp_path, **{"eval.split": "test"})).test_data
    assert torch.equal(got[1], task.test_data[1][test])
    assert torch.equal(got[0], task.test_data[0][test])
