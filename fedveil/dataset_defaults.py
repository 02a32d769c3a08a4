"""What each built-in dataset runs well on, applied to the settings a user left unset.

Torch-free on purpose: `fedveil simulate --help` shows these beside each flag's default,
and every command builds that parser. `fedveil.tasks` re-exports both names.
"""

from __future__ import annotations

__all__ = ["DATASET_DEFAULTS", "dataset_defaults", "per_key"]

# What each built-in dataset runs well on, where the global defaults (the small CNN,
# 100 clients, plain FedAvg) do not fit it: synthetic data is tabular (no CNN), and
# digits' 1,437 training images are 8x8 (too small for the CNN, too few for 100
# Dirichlet clients of at least 10 examples). Fashion-MNIST, the default job, trains
# with server momentum (FedAvgM, 0.7) and a local learning rate of 0.1: under
# Dirichlet(0.5) skew it reaches 85% test accuracy in about half the rounds plain
# FedAvg at 0.05 takes (docs/explanation/performance.md). Applied to settings the user
# left unset.
DATASET_DEFAULTS: dict[str, dict[str, object]] = {
    "fashion-mnist": {
        "client.lr": 0.1,
        "server.optimizer": "fedavgm",
        "server.server_momentum": 0.7,
    },
    "digits": {"model.name": "mlp", "data.num_clients": 20},
    "synthetic": {"model.name": "mlp"},
}


def dataset_defaults(dataset: str, given: set[str] | frozenset[str]) -> dict[str, object]:
    """The dataset's own defaults (dotted config keys) for the settings not in `given`."""
    return {k: v for k, v in DATASET_DEFAULTS.get(dataset, {}).items() if k not in given}


def per_key() -> dict[str, dict[str, object]]:
    """'section.key' -> {dataset: its default}, for --help."""
    keyed: dict[str, dict[str, object]] = {}
    for dataset, values in DATASET_DEFAULTS.items():
        for key, value in values.items():
            keyed.setdefault(key, {})[dataset] = value
    return keyed
