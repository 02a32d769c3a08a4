"""The updates an observer sees, computed by the attack harness through fedveil's own
local-training code path (client/training.py `train_local`).

- one client's plain update;
- the secure sum of K clients: secure aggregation reveals exactly this sum to the
  server, so the harness computes it in the clear;
- the central-DP release: each update clipped and the sum noised by privacy/dp's own
  clip_l2 and add_gaussian_noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedveil.builtin_models import build_model
from fedveil.client.training import LocalTraining, train_local
from fedveil.flat_model import FlatModel
from fedveil.privacy.dp.central import add_gaussian_noise
from fedveil.privacy.dp.clipping import clip_l2

# A client with at most 32 examples takes one step per epoch at the config default
# (batch_size 32, local_epochs 1): on these client sizes the default IS FedSGD. The
# multi-step setting trains this many full-batch epochs instead.
LOCAL_EPOCHS_MULTI_STEP = 5
DEFAULT_LR = LocalTraining().lr


@dataclass(frozen=True)
class Observed:
    """What the observer holds: the released vector, and the truth to score against."""

    model: FlatModel
    global_vector: torch.Tensor
    update: torch.Tensor  # the sum the observer sees (float32, flat)
    images: torch.Tensor  # the true training images inside it, N x C x H x W (normalised)
    labels: torch.Tensor
    local_steps: int
    lr: float


def fresh_mlp(input_shape: tuple[int, ...], num_classes: int, seed: int) -> FlatModel:
    """The built-in MLP at a seeded initialisation: the global model of round one."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        return FlatModel(build_model("mlp", input_shape, num_classes))


def client_update(
    model: FlatModel,
    global_vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    local_steps: int,
    seed: int,
    lr: float = DEFAULT_LR,
) -> torch.Tensor:
    """One client's update (local - global) on its examples (x, y), through train_local.

    local_steps=1 is FedSGD (one full-batch step); more steps are full-batch epochs.
    """
    if local_steps < 1:
        raise ValueError(f"local_steps={local_steps!r} is invalid; allowed: >= 1")
    hp = LocalTraining(local_epochs=0, local_steps=local_steps, batch_size=int(x.shape[0]), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    return train_local(model, global_vector, x, y, hp, F.cross_entropy, gen).delta.clone()


def observe(
    x_pool: torch.Tensor,
    y_pool: torch.Tensor,
    num_classes: int,
    *,
    clients: int,
    batch: int,
    local_steps: int,
    seed: int,
    dp_noise: float = 0.0,
    clip_norm: float = 1.0,
    rng: np.random.Generator | None = None,
) -> Observed:
    """The (secure) sum of `clients` updates, each on `batch` distinct images drawn from
    the pool; with dp_noise > 0 the central-DP release of that sum (clip each update to
    `clip_norm`, add N(0, (dp_noise * clip_norm)^2) to the sum). No `rng`: CSPRNG noise.
    """
    for name, value in (("clients", clients), ("batch", batch)):
        if value < 1:
            raise ValueError(f"{name}={value!r} is invalid; allowed: >= 1")
    need = clients * batch
    if need > x_pool.shape[0]:
        raise ValueError(f"clients x batch = {need} exceeds the {x_pool.shape[0]} images")
    if dp_noise < 0:
        raise ValueError(f"dp_noise={dp_noise!r} is invalid; allowed: >= 0 (0: no DP)")
    pick = torch.randperm(int(x_pool.shape[0]), generator=torch.Generator().manual_seed(seed))
    idx = pick[:need]
    images, labels = x_pool[idx], y_pool[idx]
    model = fresh_mlp(tuple(images.shape[1:]), num_classes, seed)
    global_vector = model.get().clone()
    total = torch.zeros_like(global_vector, dtype=torch.float64)
    for k in range(clients):
        sl = slice(k * batch, (k + 1) * batch)
        delta = client_update(model, global_vector, images[sl], labels[sl], local_steps, seed + k)
        if dp_noise > 0:
            delta = torch.from_numpy(clip_l2(delta, clip_norm))
        total += delta.double()
    released = total.float()
    if dp_noise > 0:
        released = torch.from_numpy(add_gaussian_noise(total.numpy(), dp_noise, clip_norm, rng))
    return Observed(model, global_vector, released, images, labels, local_steps, DEFAULT_LR)
