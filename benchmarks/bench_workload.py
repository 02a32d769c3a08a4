"""The simulation benchmark's workload, shared by fedveil, the Flower peer and the bare loop.

A ~100k-parameter MLP (the built-in `mlp`, 784-128-10) trained for one local
epoch (batch 32, plain SGD) on about 100 generated 28x28 examples per client.
Clients draw their examples from one shared generated pool, so the data's
memory does not grow with the population.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from fedveil.benchmarks.memwatch import RoundClock
from fedveil.builtin_models import build_model
from fedveil.tasks import ClientData, Task

INPUT_SHAPE = (1, 28, 28)
CLASSES = 10


@dataclass(frozen=True)
class Workload:
    clients: int = 100
    per_round: int = 100
    rounds: int = 5
    examples: int = 100
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0
    pool: int = 10_000  # generated examples the clients draw from

    def __post_init__(self) -> None:
        limits = {
            "clients": (1, 1_000_000),
            "per_round": (1, self.clients),
            "rounds": (1, 100_000),
            "examples": (1, 100_000),
            "batch_size": (1, 65_536),
            "pool": (1, 10_000_000),
        }
        for name, (lo, hi) in limits.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"{name} = {value}: must be in [{lo}, {hi}]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class SyntheticPool:
    """Client `cid`'s examples: `examples` rows of a generated pool, chosen by (seed, cid).

    Labels come from a fixed random linear teacher, so the task is learnable.
    Picklable and cheap to rebuild: every process builds the same pool from the seed.
    """

    def __init__(self, w: Workload) -> None:
        self.w = w
        g = torch.Generator().manual_seed(w.seed)
        self.x = torch.randn(w.pool, *INPUT_SHAPE, generator=g)
        teacher = torch.randn(int(np.prod(INPUT_SHAPE)), CLASSES, generator=g)
        self.y = (self.x.reshape(w.pool, -1) @ teacher).argmax(dim=1)

    def indices(self, cid: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.w.seed * 1_000_003 + cid + 1)
        return torch.randint(0, self.w.pool, (self.w.examples,), generator=g)

    def __call__(self, cid: int) -> ClientData:
        if not 0 <= cid < self.w.clients:
            raise IndexError(f"client id {cid} out of range [0, {self.w.clients})")
        idx = self.indices(cid)
        return ClientData(self.x[idx], self.y[idx])


def mlp() -> torch.nn.Module:
    return build_model("mlp", INPUT_SHAPE, CLASSES)


def bench_task(w: Workload) -> Task:
    data = SyntheticPool(w)
    return Task(
        name="bench/mlp",
        input_shape=INPUT_SHAPE,
        num_classes=CLASSES,
        num_clients=w.clients,
        model_fn=mlp,
        client_data=data,
        client_sizes=np.full(w.clients, w.examples, dtype=np.int64),
    )


class BenchTaskFactory:
    """Picklable: rebuilds the benchmark task (for spawned workers)."""

    def __init__(self, w: Workload) -> None:
        self.w = w

    def __call__(self) -> Task:
        return bench_task(self.w)


def local_epoch(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    w: Workload,
    generator: torch.Generator,
) -> float:
    """One epoch of plain SGD, the way a user writes it: what the bare loop and Flower run."""
    opt = torch.optim.SGD(model.parameters(), lr=w.lr)
    model.train()
    n = int(x.shape[0])
    order = torch.randperm(n, generator=generator)
    loss_sum, steps = 0.0, 0
    for start in range(0, n, w.batch_size):
        idx = order[start : start + w.batch_size]
        opt.zero_grad(set_to_none=True)
        loss = functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        loss_sum += loss.item()
        steps += 1
    return loss_sum / max(steps, 1)


def sample_cohort(rng: np.random.Generator, w: Workload) -> list[int]:
    return sorted(int(c) for c in rng.choice(w.clients, size=w.per_round, replace=False))


def run_bare(w: Workload) -> dict[str, Any]:
    """The lower bound: the same local steps in a plain torch loop, no framework at all.

    One process, one torch thread (on this small model intra-op threads gain
    little, and they make a loaded machine far slower: OpenMP's barriers spin),
    and the engine's allocator setting (freed memory kept for reuse), so the bound
    is not loosened by costs the engine avoids.
    """
    from fedveil.simulations.workers import keep_freed_memory

    keep_freed_memory()
    torch.set_num_threads(1)
    data = SyntheticPool(w)
    torch.manual_seed(w.seed)
    model = mlp()
    params = list(model.parameters())
    global_params = [p.detach().clone() for p in params]
    rng = np.random.default_rng(w.seed)
    losses: list[float] = []
    clock = RoundClock()
    clock.mark()
    for round_num in range(1, w.rounds + 1):
        sums = [torch.zeros_like(p) for p in params]
        loss_sum = 0.0
        for cid in sample_cohort(rng, w):
            d = data(cid)
            with torch.no_grad():
                for p, g in zip(params, global_params, strict=True):
                    p.copy_(g)
            gen = torch.Generator().manual_seed(w.seed * 7919 + round_num * 1_000_003 + cid)
            loss_sum += local_epoch(model, d.x, d.y, w, gen)
            with torch.no_grad():
                for s, p, g in zip(sums, params, global_params, strict=True):
                    s.add_(p - g, alpha=len(d))
        with torch.no_grad():
            total = w.per_round * w.examples
            for g, s in zip(global_params, sums, strict=True):
                g.add_(s, alpha=1.0 / total)
        clock.mark()
        losses.append(loss_sum / w.per_round)
    return {**clock.result(), "train_loss": losses}
