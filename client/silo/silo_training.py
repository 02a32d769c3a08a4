"""A silo's run: train locally, take the secure mean, apply it; every silo the same.

All silos start from the model the run seed initialises (in one process: one vector),
train on their own data with the client's own `train_local` and batch-order generator,
and apply the same mean
(server.server_lr x the mean update): their models stay identical without a coordinator.
`on_round(round, result, vector)` sees each applied round (evaluation, metrics).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.tasks import Task

from ..runtime import client_generator
from ..training import LocalTraining, train_local
from .round import RoundResult, SiloRound

RoundHook = Callable[[int, RoundResult, torch.Tensor], None]


def initial_model(cfg: RunConfig, task: Task) -> FlatModel:
    torch.manual_seed(cfg.seed)
    return FlatModel(task.model_fn())


def hyperparameters(cfg: RunConfig) -> LocalTraining:
    c = cfg.client
    return LocalTraining(
        local_epochs=c.local_epochs,
        local_steps=c.local_steps,
        batch_size=c.batch_size,
        lr=c.lr,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
        prox_mu=c.prox_mu,
    )


def train_silo(
    cfg: RunConfig,
    task: Task,
    silo: int,
    rounds: SiloRound,
    on_round: RoundHook | None = None,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """The final model vector after cfg.server.rounds applied rounds. `start`: the initial
    model vector (silos in threads of one process share one: torch's global generator,
    which seeds the initialisation, is shared by the threads); None: from the run seed."""
    model = initial_model(cfg, task)
    vector = (model.flat if start is None else start).detach().clone()
    data = task.client_data(silo)
    hp = hyperparameters(cfg)
    for round_num in range(1, cfg.server.rounds + 1):
        generator = client_generator(cfg.seed, round_num, silo)
        rounds.prepare(round_num, vector.numel())  # keys, masks, rounding while it trains
        local = train_local(model, vector, data.x, data.y, hp, task.loss_fn, generator)
        result = rounds.run(round_num, local.delta.detach().cpu().numpy(), local.num_examples)
        vector = vector + cfg.server.server_lr * torch.from_numpy(result.mean)
        if on_round is not None:
            on_round(round_num, result, vector)
    return vector
