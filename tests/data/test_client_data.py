"""client_partitions / client_tensors glue for the engine."""

import numpy as np
import pytest
import torch

from fedveil.data.client_data import client_partitions, client_tensors
from fedveil.data.datasets import load_dataset
from fedveil.data.writer_style import apply_writer_style


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_scheme_partitions_and_writer_tensors(digits):
    parts = client_partitions(digits, 10, "writer", seed=4)
    assert sum(len(p) for p in parts) == digits.num_train
    x, y = client_tensors(digits, parts[2], 2, scheme="writer", seed=4)
    idx = torch.from_numpy(parts[2])
    assert torch.equal(y, digits.y_train[idx])
    assert torch.equal(x, apply_writer_style(digits.x_train[idx], 2, 4))
    plain, _ = client_tensors(digits, parts[2], 2, scheme="iid", seed=4)
    assert torch.equal(plain, digits.x_train[idx])


def test_natural_partition():
    ds = load_dataset("synthetic", num_clients=5, seed=1)
    parts = client_partitions(ds, 5, "natural", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, ds.natural_partition, strict=True))
    with pytest.raises(ValueError, match=r"num_clients=4 but dataset .* has 5 natural clients"):
        client_partitions(ds, 4, "natural", seed=0)


def test_natural_needs_a_naturally_split_dataset(digits):
    with pytest.raises(ValueError, match="'digits' has no natural partition; use one of: iid"):
        client_partitions(digits, 5, "natural", seed=0)
