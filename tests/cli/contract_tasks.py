"""Custom tasks that break the task contract the way users do (issue 19), and two that
keep it: a regression task with its own loss, and a task with a fixed population."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from fedveil.config import RunConfig
from fedveil.tasks import ClientData, Task

FEATURES, CLASSES, CLIENTS = 8, 3, 6


def _data(seed: int, n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def _task(client_data=None, model=None, loss_fn=functional.cross_entropy, test=True, **kw) -> Task:
    def data(cid: int) -> ClientData:
        return ClientData(*_data(cid))

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    return Task(
        name="contract-test",
        input_shape=(FEATURES,),
        num_classes=CLASSES,
        num_clients=kw.pop("num_clients", CLIENTS),
        model_fn=model or mlp,
        client_data=client_data or data,
        test_data=_data(999, 100) if test else None,
        loss_fn=loss_fn,
        **kw,
    )


def good(cfg: RunConfig) -> Task:
    """A fixed population of CLIENTS: it does not read data.num_clients."""
    return _task()


def float_labels(cfg: RunConfig) -> Task:
    def data(cid: int) -> ClientData:
        x, y = _data(cid)
        return ClientData(x, y.float())

    return _task(client_data=data, test=False)


def numpy_arrays(cfg: RunConfig) -> Task:
    def data(cid: int) -> ClientData:
        x, y = _data(cid)
        return ClientData(x.numpy(), y.numpy())  # type: ignore[arg-type]

    return _task(client_data=data, test=False)


def no_arguments() -> Task:
    return _task()


def returns_a_dict(cfg: RunConfig) -> dict:
    return {"model": None}


def wrong_input_size(cfg: RunConfig) -> Task:
    return _task(model=lambda: nn.Sequential(nn.Linear(FEATURES + 2, CLASSES)))


def too_many_logits(cfg: RunConfig) -> Task:
    """num_classes = 2 with a model that outputs 3 logits: cross-entropy accepts it, so it
    used to train with exit 0 and no warning."""
    task = _task(model=lambda: nn.Sequential(nn.Linear(FEATURES, 3)))
    task.num_classes = 2
    return task


def regression(cfg: RunConfig) -> Task:
    """Float targets are right here: the task brings its own loss (MSE)."""

    def data(cid: int) -> ClientData:
        x, _ = _data(cid)
        return ClientData(x, x[:, :1] * 2.0 - 1.0)

    def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return functional.mse_loss(out, y)

    test_x, _ = _data(999, 100)
    task = _task(
        client_data=data,
        model=lambda: nn.Linear(FEATURES, 1),
        loss_fn=mse,
        test=False,
    )
    task.test_data = (test_x, test_x[:, :1] * 2.0 - 1.0)
    return task


_calls = {"n": 0}


def fails_after_the_check(cfg: RunConfig) -> Task:
    """Client data is fine on the first read (the contract check), then every client's
    labels are floats: every client fails in every round (in one process)."""

    def data(cid: int) -> ClientData:
        _calls["n"] += 1
        x, y = _data(cid)
        return ClientData(x, y if _calls["n"] == 1 else y.float())

    return _task(client_data=data, client_sizes=np.full(CLIENTS, 40))
