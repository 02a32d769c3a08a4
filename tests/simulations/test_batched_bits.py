"""The batched trainer's exact bits, pinned: an optimisation of simulations/batched.py must
keep every client's update and loss the same bit for bit (issue 36: models without DP are
unchanged by every optimisation).

The golden runs (tests/engine/test_golden_runs.py) rarely form a unit (the tiny task's
clients have different sizes); these cases train units of the benchmark's MLP with the
settings the trainer handles differently: plain SGD over two epochs with a partial last
batch, momentum with weight decay on a step budget, FedProx, and one starting model per
client (gossip). The digests were written by the trainer before the optimisations
(commit 3a62fdd; the written-out backward kept them); regenerate only on purpose:
    .venv/bin/python tests/simulations/test_batched_bits.py
"""

from __future__ import annotations

import hashlib
import sys

import pytest
import torch
from torch.nn import functional

from fedveil.benchmarks.bench_workload import SyntheticPool, Workload, mlp
from fedveil.client.runtime import client_generator
from fedveil.client.training import LocalTraining
from fedveil.flat_model import FlatModel
from fedveil.simulations.batched import BatchedTrainer

CASES: dict[str, tuple[LocalTraining, bool]] = {
    "sgd_two_epochs": (LocalTraining(local_epochs=2, batch_size=8, lr=0.05), False),
    "momentum_decay_steps": (
        LocalTraining(local_steps=7, batch_size=10, lr=0.05, momentum=0.9, weight_decay=0.01),
        False,
    ),
    "fedprox": (LocalTraining(batch_size=16, lr=0.1, momentum=0.5, prox_mu=0.1), False),
    "rows_momentum": (LocalTraining(batch_size=8, lr=0.05, momentum=0.5), True),
}

DIGESTS = {
    "sgd_two_epochs": "42d86572e5794eed19ddc7bd10f3d68c849501ac9fb97635a97529876fa52adc",
    "momentum_decay_steps": "03d30f54e1a5de3dba48c7ee2479d5e665690a9c2de2bccc02cc500b24b165da",
    "fedprox": "b8d73679de569defcb020bbe093142ba0cc7f8bfe1ac4093363ee0dc06fd01a3",
    "rows_momentum": "1a162971d5739bbfec0eada5049ade7fefe2a340057a6d0f040eb4a22cad3ba1",
}


def digest(case: str) -> str:
    torch.set_num_threads(1)
    hp, rows = CASES[case]
    pool = SyntheticPool(Workload(clients=20, per_round=6, examples=37, pool=500))
    torch.manual_seed(0)
    model = FlatModel(mlp())
    start = model.get()
    if rows:  # each client its own starting model
        start = torch.stack([start + 0.01 * i for i in range(6)])
    trainer = BatchedTrainer(model, functional.cross_entropy)
    results = trainer.train(
        start, [pool(c) for c in range(6)], hp, [client_generator(3, 1, c) for c in range(6)]
    )
    h = hashlib.sha256()
    for r in results:
        h.update(r.delta.numpy().tobytes())
        h.update(repr((r.num_examples, r.steps, r.loss)).encode())
    return h.hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_batched_training_keeps_its_bits(case: str) -> None:
    threads = torch.get_num_threads()
    try:
        assert digest(case) == DIGESTS[case]
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    for name in CASES:
        print(f'    "{name}": "{digest(name)}",')
    sys.exit(0)


STACKS = {
    "mlp": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    ),
    "mlp_no_bias": lambda: torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 32, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 10),
    ),
    # three layers: the backward carries the input's gradient through two of them
    "deep": lambda: torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 16, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 10),
    ),
    "logreg": lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)),
}


@pytest.mark.parametrize("stack", list(STACKS))
def test_a_plain_stack_written_out_gives_vmaps_bits(stack: str) -> None:
    # A plain stack (Flatten, Linear, ReLU) trains through the written-out forward and
    # backward (no autograd: it trains under torch.no_grad()); the same trainer made to
    # take autograd over the written-out forward, and vmap's path, must give the same bits.
    model = STACKS[stack]
    torch.manual_seed(1)
    flat = FlatModel(model())
    pool = SyntheticPool(Workload(clients=20, per_round=6, examples=21, pool=200))
    hp = LocalTraining(batch_size=8, lr=0.1, momentum=0.5, weight_decay=0.01, prox_mu=0.1)
    got = []
    for path in ("by_hand", "autograd", "vmap"):
        trainer = BatchedTrainer(flat, functional.cross_entropy)
        assert trainer._stack is not None  # the written-out path
        if path != "by_hand":
            trainer._by_hand = False  # autograd computes the gradients
        if path == "vmap":
            trainer._stack = None  # vmap over functional_call, the general path
        with torch.set_grad_enabled(path != "by_hand"):
            results = trainer.train(
                flat.get(),
                [pool(c) for c in range(4)],
                hp,
                [client_generator(5, 2, c) for c in range(4)],
            )
        got.append((torch.stack([r.delta for r in results]), [r.loss for r in results]))
    for other in got[1:]:
        assert torch.equal(got[0][0], other[0]) and got[0][1] == other[1]
