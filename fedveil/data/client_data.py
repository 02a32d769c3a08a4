"""Glue for the round engine: dataset + scheme -> per-client index arrays and tensors.

    ds = load_dataset("fashion-mnist")
    parts = client_partitions(ds, num_clients=100, scheme="writer", seed=0)
    x, y = client_tensors(ds, parts[cid], cid, scheme="writer", seed=0)

``scheme="natural"`` uses the split a dataset ships with (``synthetic``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedveil.data.datasets import Dataset
from fedveil.data.partition import SCHEMES, partition
from fedveil.data.writer_style import apply_writer_style

__all__ = ["client_partitions", "client_tensors"]


def client_partitions(
    dataset: Dataset, num_clients: int, scheme: str, seed: int, **params: Any
) -> list[np.ndarray]:
    """Train indices per client: ``partition(dataset.y_train, ...)`` or the natural split."""
    if scheme != "natural":
        return partition(dataset.y_train.numpy(), num_clients, scheme, seed, **params)
    natural = dataset.natural_partition
    if natural is None:
        raise ValueError(
            f"dataset {dataset.name!r} has no natural partition; use one of: {', '.join(SCHEMES)}"
        )
    if num_clients != len(natural):
        raise ValueError(
            f"num_clients={num_clients} but dataset {dataset.name!r} has {len(natural)} "
            "natural clients (set num_clients when loading it)"
        )
    if params:
        raise ValueError(f"scheme 'natural' takes no parameters, got {', '.join(sorted(params))}")
    return [p.copy() for p in natural]


def client_tensors(
    dataset: Dataset, indices: np.ndarray, client_id: int, *, scheme: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's training tensors; ``writer`` clients get their handwriting style here."""
    idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    x, y = dataset.x_train[idx], dataset.y_train[idx]
    if scheme == "writer":
        x = apply_writer_style(x, client_id, seed)
    return x, y
