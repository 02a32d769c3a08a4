"""A tiny user task (Gaussian blobs, 12 clients): exercises the `module:function` plug-in path
and keeps engine tests fast."""

from __future__ import annotations

import os
import time
from pathlib import Path

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


# make_gated_eval: the environment names a file and a round; that round's central
# evaluation creates the file and waits, so a test can signal the run exactly there.
EVAL_GATE_FILE, EVAL_GATE_ROUND = "TINY_EVAL_GATE_FILE", "TINY_EVAL_GATE_ROUND"


class _GatedEval(nn.Module):
    """The tiny model, whose test-set evaluation (eval mode, a batch of 100 rows or more:
    the test set's first batch; no client holds that many rows) counts rounds and waits
    at the gate's."""

    evaluations = 0  # this process's central evaluations

    def __init__(self, gate: Path, at_round: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.gate, self.at_round = gate, at_round

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and x.shape[0] >= 100:
            _GatedEval.evaluations += 1
            if _GatedEval.evaluations == self.at_round:
                self.gate.write_text(str(self.at_round))
                time.sleep(300)  # the test's signal lands here
        return self.net(x)


def make_gated_eval(cfg: RunConfig) -> Task:
    """The tiny task whose round-`TINY_EVAL_GATE_ROUND` evaluation creates the file
    `TINY_EVAL_GATE_FILE` and waits (a signal at a known moment: after the round's model
    was stepped, before its record and checkpoint are stored)."""
    task = make(cfg)
    gate, at_round = Path(os.environ[EVAL_GATE_FILE]), int(os.environ[EVAL_GATE_ROUND])
    task.model_fn = lambda: _GatedEval(gate, at_round)
    return task


class _CtrlCInEval(nn.Module):
    """The tiny model, whose test-set evaluation of round `at_round` (the server's model,
    counted per instance) raises KeyboardInterrupt, as Ctrl-C there does: after the
    round's model was stepped, before its record and checkpoint are stored."""

    def __init__(self, at_round: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
        self.at_round, self.evaluations = at_round, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and x.shape[0] >= 100:
            self.evaluations += 1
            if self.evaluations == self.at_round:
                raise KeyboardInterrupt
        return self.net(x)


def make_ctrl_c_in_eval_3(cfg: RunConfig) -> Task:
    """The tiny task Ctrl-C'd (in process) during round 3's central evaluation."""
    task = make(cfg)
    task.model_fn = lambda: _CtrlCInEval(3)
    return task
