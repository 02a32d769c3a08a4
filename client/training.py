"""Local training on one client: SGD (momentum, weight decay, FedProx) over its data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch.optim.sgd import sgd as sgd_update

from fedveil.flat_model import FlatModel
from fedveil.task_types import LossFn


@dataclass(frozen=True)
class LocalTraining:
    """Hyper-parameters the server sends with each round (the client may cap them)."""

    local_epochs: int = 1
    local_steps: int = 0
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0

    def steps_for(self, num_examples: int) -> int:
        if self.local_steps > 0:
            return self.local_steps
        per_epoch = -(-num_examples // self.batch_size)
        return self.local_epochs * per_epoch


@dataclass
class LocalResult:
    delta: torch.Tensor  # local - global, float32, on the training device
    num_examples: int
    steps: int
    loss: float  # mean training loss over the local steps


class Trainer(Protocol):
    """Local training as the client runtime calls it (`train_local`, or the in-process
    engine's, which may hand back a result it computed for several clients at once)."""

    def __call__(
        self,
        model: FlatModel,
        global_vector: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        hp: LocalTraining,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> LocalResult: ...


def train_local(
    model: FlatModel,
    global_vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    hp: LocalTraining,
    loss_fn: LossFn,
    generator: torch.Generator,
) -> LocalResult:
    """Train `model` from `global_vector` on (x, y); returns the update.

    Batches are drawn from a permutation made by `generator` (a CPU generator
    seeded from run seed, round and client id), so a client's update is the
    same whichever transport or process runs it.
    """
    n = int(x.shape[0])
    if n == 0:
        raise ValueError("client has no training examples")
    device = model.device
    model.set(global_vector)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    params = [p for p in model.module.parameters() if p.requires_grad]
    momentum_buffers: dict[int, torch.Tensor] = {}
    anchor = global_vector.to(device) if hp.prox_mu > 0 else None
    module = model.module
    module.train()
    total_steps = hp.steps_for(n)
    loss_sum = torch.zeros((), device=device)
    step = 0
    while step < total_steps:
        order = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n, hp.batch_size):
            if step >= total_steps:
                break
            idx = order[start : start + hp.batch_size]
            for p in params:
                p.grad = None
            loss = loss_fn(module(x[idx]), y[idx])
            loss.backward()
            if anchor is not None:
                # FedProx: gradient of (mu/2)||w - w_global||^2, added per parameter view.
                _add_prox_gradient(model, anchor, hp.prox_mu)
            _sgd_step(params, momentum_buffers, hp)
            loss_sum += loss.detach()
            step += 1
    delta = model.flat.detach() - global_vector.to(device)
    return LocalResult(delta, n, total_steps, float(loss_sum) / max(total_steps, 1))


def _sgd_step(
    params: list[torch.Tensor], momentum_buffers: dict[int, torch.Tensor], hp: LocalTraining
) -> None:
    """One step of torch.optim.SGD, through the functional form its `step` calls.

    The same arithmetic (and the same defaults), without an Optimizer object:
    constructing the first one in a process imports torch._dynamo, ~1 s of
    start-up for every simulation worker and edge client.
    """
    live = [i for i, p in enumerate(params) if p.grad is not None]
    buffers = [momentum_buffers.get(i) for i in live] if hp.momentum else []
    with torch.no_grad():
        sgd_update(
            [params[i] for i in live],
            [params[i].grad for i in live],  # type: ignore[misc]
            buffers,
            weight_decay=hp.weight_decay,
            momentum=hp.momentum,
            lr=hp.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
    for i, buf in zip(live, buffers, strict=False):
        if buf is not None:
            momentum_buffers[i] = buf


def _add_prox_gradient(model: FlatModel, anchor: torch.Tensor, mu: float) -> None:
    for entry, p in zip(model.entries, _tensors_in_order(model), strict=True):
        if p.grad is None:
            continue
        ref = anchor[entry.offset : entry.offset + entry.numel].view(entry.shape)
        p.grad.add_(p.detach() - ref, alpha=mu)


def _tensors_in_order(model: FlatModel) -> list[torch.Tensor]:
    tensors = dict(model.module.named_parameters())
    tensors.update(dict(model.module.named_buffers()))
    return [tensors[e.name] for e in model.entries]


@dataclass
class DpSgdResult(LocalResult):
    noise_multiplier: float = 0.0
    sample_rate: float = 0.0


def dp_sgd_plan(hp: LocalTraining, num_examples: int) -> tuple[float, int]:
    """(Poisson sampling rate, noised steps) that `train_local_dp_sgd` runs on
    `num_examples` examples: the rate is batch_size / n, an epoch is Opacus' int(1 / rate)
    batches, and local_steps (a device's cap) stops it early. A device accounts its
    epsilon from this before it trains (client/dpsgd_budget.py)."""
    if num_examples < 1:
        raise ValueError("client has no training examples")
    rate = min(1.0, hp.batch_size / num_examples)
    per_epoch = int(1 / rate)  # UniformWithReplacementSampler's own count
    steps = max(1, hp.local_epochs) * per_epoch
    if hp.local_steps > 0:
        steps = min(steps, hp.local_steps)
    return rate, steps


def train_local_dp_sgd(
    module: torch.nn.Module,
    global_vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    hp: LocalTraining,
    loss_fn: LossFn,
    noise_multiplier: float,
    max_grad_norm: float,
) -> DpSgdResult:
    """Sample-level DP: Opacus DP-SGD with Poisson batches at rate batch_size / n.

    A fresh module per call (Opacus hooks stay off the shared model); the
    noise comes from a generator seeded by the OS CSPRNG.
    """
    from fedveil.privacy.dp.dpsgd import dp_sgd_step, make_private_dp_sgd

    n = int(x.shape[0])
    model = FlatModel(module)
    model.set(global_vector.cpu())
    rate, planned = dp_sgd_plan(hp, n)
    opt = torch.optim.SGD(
        module.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay
    )
    session = make_private_dp_sgd(
        module,
        opt,
        torch.utils.data.TensorDataset(x.cpu(), y.cpu()),
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        sample_rate=rate,
    )
    session.module.train()
    loss_sum, batches = 0.0, 0
    for _ in range(max(1, hp.local_epochs)):
        for xb, yb in session.data_loader:
            if session.steps >= planned:  # a device's local_steps cap binds DP-SGD too
                break
            # An empty Poisson batch takes a noise-only step: the accountant counts it.
            loss = dp_sgd_step(session, loss_fn, xb, yb)
            if loss is not None:
                loss_sum += loss
                batches += 1
    delta = model.flat.detach() - global_vector.cpu()
    return DpSgdResult(delta, n, session.steps, loss_sum / max(batches, 1), noise_multiplier, rate)
