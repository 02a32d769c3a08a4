"""Units of clients trained at once: the same training, reproducible, and only when it is safe."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedveil.benchmarks.bench_workload import Workload, bench_task
from fedveil.client.runtime import client_generator
from fedveil.client.training import LocalTraining, train_local
from fedveil.config import load_config
from fedveil.flat_model import FlatModel
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.rounds import RoundEngine
from fedveil.simulations.batched import BatchedTrainer
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.sequential_clients import SequentialClients, plan_units

W = Workload(clients=24, per_round=20, rounds=2, examples=10, pool=300)


def config(**extra):
    values = {
        "data.num_clients": W.clients,
        "model.name": "mlp",
        "server.per_round": W.per_round,
        "server.rounds": W.rounds,
        "client.batch_size": 4,
        "client.momentum": 0.5,
        "eval.central_every": 0,
    }
    values.update(extra)
    return load_config(None, values)


def run(workers: int, unit_size: int, **extra) -> torch.Tensor:
    cfg = config(**extra)
    task = bench_task(W)
    with InProcessTransport(task, workers=workers, unit_size=unit_size) as transport:
        engine = RoundEngine(cfg, task, transport)
        engine.run()
    return engine.weights


@pytest.mark.procs
def test_units_give_the_same_bits_whatever_the_workers():
    assert SequentialClients(bench_task(W), unit_size=4).batcher is not None, "the MLP qualifies"
    assert torch.equal(run(1, 4), run(3, 4))


def test_units_train_like_one_client_at_a_time():
    batched, single = run(1, 8), run(1, 1)
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "hp",
    [
        LocalTraining(local_epochs=2, batch_size=3, lr=0.1),
        LocalTraining(local_epochs=0, local_steps=5, batch_size=4, lr=0.05, momentum=0.9),
        LocalTraining(local_epochs=1, batch_size=4, lr=0.05, weight_decay=0.01, prox_mu=0.5),
    ],
    ids=["epochs", "steps+momentum", "decay+prox"],
)
def test_a_unit_matches_train_local_client_by_client(hp):
    task = bench_task(W)
    model = FlatModel(task.model_fn())
    trainer = BatchedTrainer(model, task.loss_fn)
    start = model.get() + 0.01
    clients = [3, 7, 11]
    got = trainer.train(
        start,
        [task.client_data(c) for c in clients],
        hp,
        [client_generator(5, 2, c) for c in clients],
    )
    for cid, result in zip(clients, got, strict=True):
        d = task.client_data(cid)
        want = train_local(model, start, d.x, d.y, hp, task.loss_fn, client_generator(5, 2, cid))
        assert result.steps == want.steps and result.num_examples == want.num_examples
        torch.testing.assert_close(result.delta, want.delta, rtol=1e-5, atol=1e-7)
        assert result.loss == pytest.approx(want.loss, rel=1e-5)


def test_only_fresh_same_size_plain_training_requests_share_a_unit():
    model = torch.zeros(4)
    train = Envelope("train", 1, {"seed": 0, "lr": 0.1}, {"model": model})
    other_model = Envelope("train", 1, {"seed": 0, "lr": 0.1}, {"model": torch.zeros(4)})
    dp = Envelope("train", 1, {"seed": 0, "lr": 0.1, "noise_multiplier": 1.0}, {"model": model})
    sizes = torch.tensor([10, 10, 10, 10, 10, 12, 10, 10]).numpy()
    requests = [(c, train) for c in (4, 0, 1, 2, 5, 3)] + [(6, other_model), (7, dp)]
    units = plan_units(requests, sizes, seen={3}, unit_size=2)
    as_ids = sorted(sorted(c for c, _ in u) for u in units)
    assert as_ids == [[0, 1], [2, 4], [3], [5], [6], [7]]
    assert plan_units(list(reversed(requests)), sizes, {3}, 2) == units, "order does not matter"
    assert all(len(u) == 1 for u in plan_units(requests, None, set(), 4)), "sizes unknown"
    assert all(len(u) == 1 for u in plan_units(requests, sizes, set(), 1)), "turned off"


class WithDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 16), nn.Dropout(0.5), nn.Linear(16, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@pytest.mark.parametrize(
    ("model_fn", "reason"),
    [
        (WithDropout, "randomness"),
        (
            lambda: nn.Sequential(
                nn.Flatten(), nn.Linear(784, 8), nn.BatchNorm1d(8), nn.Linear(8, 10)
            ),
            "",
        ),
        (
            lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(1352, 10)),
            "convolutions",
        ),
    ],
    ids=["dropout", "batchnorm", "conv"],
)
def test_models_that_cannot_be_batched_train_one_at_a_time(model_fn, reason):
    task = bench_task(W)
    task.model_fn = model_fn
    lane = SequentialClients(task, unit_size=4)
    assert lane.batcher is None
    why: list[str] = []
    assert not BatchedTrainer(FlatModel(model_fn()), task.loss_fn).probe(task.client_data(0), why)
    assert reason in why[0]
    # and the lane still trains them
    msg = RoundEngine(config(), task, _Idle()).train_request(1)
    replies = lane.run_unit([(c, msg) for c in range(4)])
    assert all(isinstance(r, Envelope) for _, r in replies)


class _Idle:
    def client_ids(self):
        return range(W.clients)

    def exchange(self, requests, timeout_s, on_reply=None):
        return {}

    def close(self):
        return None
