"""The default job's settings: Fashion-MNIST's own defaults, and only Fashion-MNIST's.

`fedveil simulate` on its defaults trains with server momentum and a local learning
rate of 0.1 (`fedveil bench default` measures what that buys against plain FedAvg);
the other built-in datasets keep plain FedAvg at the schema's learning rate, and
anything the user sets wins.
"""

from __future__ import annotations

from fedveil.cli.simulate import resolve_config


def test_the_default_job_trains_with_server_momentum() -> None:
    cfg = resolve_config(None, {})
    assert cfg.data.dataset == "fashion-mnist" and cfg.model.name == "cnn"
    assert cfg.server.optimizer == "fedavgm" and cfg.server.server_momentum == 0.7
    assert cfg.client.lr == 0.1 and cfg.client.momentum == 0.5
    assert cfg.server.rounds == 60 and cfg.server.per_round == 20
    assert cfg.data.num_clients == 100 and cfg.data.alpha == 0.5


def test_other_datasets_keep_plain_fedavg() -> None:
    for dataset in ("digits", "synthetic"):
        cfg = resolve_config(None, {"data.dataset": dataset})
        assert cfg.server.optimizer == "fedavg" and cfg.client.lr == 0.05, dataset
        assert cfg.model.name == "mlp", dataset


def test_what_the_user_sets_wins_over_the_datasets_defaults() -> None:
    cfg = resolve_config(None, {"server.optimizer": "fedavg", "client.lr": 0.02})
    assert cfg.server.optimizer == "fedavg" and cfg.client.lr == 0.02
    assert cfg.server.server_momentum == 0.7  # unset: still the dataset's
