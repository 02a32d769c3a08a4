"""A wide linear task for privacy audits: 20,010 parameters, so 1,000 random canary
directions are nearly orthogonal (cosines ~ 1/sqrt(d)), and training stays cheap."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedveil.config import RunConfig
from fedveil.tasks import ClientData, Task

FEATURES, CLASSES = 2000, 10


def make(cfg: RunConfig) -> Task:
    rng = np.random.default_rng(99)
    n = cfg.data.num_clients
    centers = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)

    def blobs(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = rng.integers(0, CLASSES, size=count)
        x = centers[y] + rng.normal(size=(count, FEATURES)).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy(y)

    clients = [blobs(16) for _ in range(n)]
    test = blobs(100)

    def client_data(cid: int) -> ClientData:
        x, y = clients[cid]
        return ClientData(x, y)

    return Task(
        name="audit-linear",
        input_shape=(FEATURES,),
        num_classes=CLASSES,
        num_clients=n,
        model_fn=lambda: nn.Linear(FEATURES, CLASSES),
        client_data=client_data,
        test_data=test,
        client_sizes=np.full(n, 16),
    )
