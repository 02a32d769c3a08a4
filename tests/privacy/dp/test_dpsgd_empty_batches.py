"""DP-SGD with Poisson sampling: an empty batch still takes a noise-only step.

The accountant (the client's own, and the server's per-client one) counts every batch
the Poisson loader yields as a step that added noise. Skipping empty batches makes the
number of noised steps, and so the released model, depend on which batches were empty.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import TensorDataset

from fedveil.builtin_models import build_model
from fedveil.client.training import LocalTraining, train_local_dp_sgd
from fedveil.flat_model import FlatModel
from fedveil.privacy.dp import PrivacyEvent, compute_epsilon, make_private_dp_sgd
from fedveil.privacy.dp.dpsgd import dp_sgd_step
from fedveil.server.engine.dpsgd_accounting import ClientDpSgdAccountant

SHAPE = (1, 16, 16)
CLASSES = 3


@pytest.fixture(autouse=True)
def _quiet_opacus(caplog: pytest.LogCaptureFixture) -> None:
    # Opacus warns when the very first Poisson batch is empty; that is the case under test.
    caplog.set_level(logging.ERROR)


def tiny_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *SHAPE, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


@pytest.mark.parametrize("model", ["logreg", "mlp", "cnn"])
def test_every_batch_empty_or_not_adds_noise_once(model: str) -> None:
    """8 examples at rate 1/8: a batch is empty with probability (7/8)^8 = 0.34."""
    torch.manual_seed(0)
    x, y = tiny_data(8)
    module = build_model(model, SHAPE, CLASSES)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    session = make_private_dp_sgd(
        module,
        optimizer,
        TensorDataset(x, y),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sample_rate=1 / 8,
        noise_seed=11,
    )
    empty = batches = 0
    for _ in range(4):
        for features, labels in session.data_loader:
            before = [p.detach().clone() for p in module.parameters()]
            loss = dp_sgd_step(session, torch.nn.functional.cross_entropy, features, labels)
            batches += 1
            assert session.steps == batches  # one noise draw per batch, as accounted
            after = list(module.parameters())
            assert all(torch.isfinite(p).all() for p in after)
            if len(labels) == 0:
                empty += 1
                assert loss is None
                # Noise only: every parameter moved although no example was used.
                assert all(not torch.equal(b, a) for b, a in zip(before, after, strict=True))
            else:
                assert loss is not None
    assert batches == 4 * len(session.data_loader) == 32
    assert empty > 0
    assert session.event() == PrivacyEvent(1.0, 1 / 8, 32)


def test_local_training_takes_the_steps_the_accountants_count() -> None:
    """The client's DP-SGD round on a tiny dataset: 10 epochs of 8 Poisson batches, about a
    third of them empty (all 80 non-empty happens with probability 2e-15)."""
    torch.manual_seed(1)
    x, y = tiny_data(8, seed=1)
    module = build_model("mlp", SHAPE, CLASSES)
    start = FlatModel(module).get().clone()
    hp = LocalTraining(local_epochs=10, batch_size=1, lr=0.1)
    result = train_local_dp_sgd(
        module, start, x, y, hp, torch.nn.functional.cross_entropy, 1.2, 1.0
    )
    assert result.sample_rate == 1 / 8
    assert result.steps == 80
    assert torch.isfinite(result.delta).all() and torch.isfinite(torch.tensor(result.loss))
    # The server's per-client accountant counts epochs x ceil(1/q) steps for the round.
    server = ClientDpSgdAccountant(1.2, 1, 10, torch.tensor([8]).numpy(), 1e-5)
    server.record_round([0])
    assert server.epsilon(0) == pytest.approx(
        compute_epsilon([PrivacyEvent(1.2, 1 / 8, result.steps)], 1e-5, "rdp")
    )
