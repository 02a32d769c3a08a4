"""A tiny user task (Gaussian blobs, 12 clients): exercises the `module:function` plug-in path
and keeps engine tests fast."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedveil.config import RunConfig
from fedveil.tasks import ClientData, Task

FEATURES, CLASSES = 8, 3


def _blobs(
    n: int, rng: np.random.Generator, centers: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    y = rng.integers(0, CLASSES, size=n)
    x = centers[y] + rng.normal(size=(n, FEATURES))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def make(cfg: RunConfig) -> Task:
    rng = np.random.default_rng(1234)
    centers = rng.normal(scale=2.0, size=(CLASSES, FEATURES))
    n = cfg.data.num_clients
    clients = [_blobs(int(rng.integers(20, 60)), rng, centers) for _ in range(n)]
    test = _blobs(300, rng, centers)

    def client_data(cid: int) -> ClientData:
        x, y = clients[cid]
        return ClientData(x, y, x[:5], y[:5])

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    return Task(
        name="tiny-blobs",
        input_shape=(FEATURES,),
        num_classes=CLASSES,
        num_clients=n,
        model_fn=model,
        client_data=client_data,
        test_data=test,
        client_sizes=np.array([len(c[1]) for c in clients]),
    )


def make_nan(cfg: RunConfig) -> Task:
    """The tiny task with every client's features NaN: each update is refused, so every
    client fails (runs whose clients all fail)."""
    task = make(cfg)
    honest = task.client_data

    def broken(cid: int) -> ClientData:
        data = honest(cid)
        return ClientData(torch.full_like(data.x, float("nan")), data.y)

    task.client_data = broken
    return task


def make_unlearnable(cfg: RunConfig) -> Task:
    """Ten classes whose labels are independent of the features: any model ends at chance
    level (0.1, on a test set large enough that no seed strays far from it)."""
    rng = np.random.default_rng(4321)
    classes, n = 10, cfg.data.num_clients

    def noise(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor(rng.normal(size=(size, FEATURES)), dtype=torch.float32)
        return x, torch.tensor(rng.integers(0, classes, size=size), dtype=torch.int64)

    clients = [noise(40) for _ in range(n)]
    return Task(
        name="tiny-unlearnable",
        input_shape=(FEATURES,),
        num_classes=classes,
        num_clients=n,
        model_fn=lambda: nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, classes)),
        client_data=lambda cid: ClientData(*clients[cid]),
        test_data=noise(5000),
        client_sizes=np.array([40] * n),
    )


def make_interrupted(cfg: RunConfig) -> Task:
    """The tiny task whose clients' data raise KeyboardInterrupt, as Ctrl-C before the
    first round completes does: nothing is kept to resume."""
    task = make(cfg)

    def interrupted(cid: int) -> ClientData:
        raise KeyboardInterrupt

    task.client_data = interrupted
    return task
