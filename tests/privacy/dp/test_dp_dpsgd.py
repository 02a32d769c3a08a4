import pytest
import torch
from torch.utils.data import TensorDataset

from fedveil.privacy.dp import PrivacyEvent, compute_epsilon, make_private_dp_sgd


def test_dp_sgd_wraps_opacus_and_accounts_per_client():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 6), torch.randint(0, 2, (128,)))
    model = torch.nn.Linear(6, 2)
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = make_private_dp_sgd(
        model,
        optimizer,
        data,
        noise_multiplier=1.1,
        max_grad_norm=1.0,
        sample_rate=0.1,
        noise_seed=3,
    )
    assert session.epsilon(1e-5) == 0.0
    loss_fn = torch.nn.CrossEntropyLoss()
    for features, labels in session.data_loader:
        session.optimizer.zero_grad()
        loss_fn(session.module(features), labels).backward()
        session.optimizer.step()
    assert session.steps == len(session.data_loader) == 10
    expected = compute_epsilon([PrivacyEvent(1.1, 0.1, 10)], 1e-5, "pld")
    assert session.epsilon(1e-5) == pytest.approx(expected)
    assert session.accountant == "pld"
    assert not torch.equal(before, model.weight.detach())
