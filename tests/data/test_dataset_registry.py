"""Registry, digits and the FedProx synthetic generator."""

import numpy as np
import pytest
import torch

from fedveil.data.datasets import Dataset, available_datasets, load_dataset
from fedveil.data.synthetic import generate_synthetic


def test_registry_lists_builtin_datasets():
    assert {"fashion-mnist", "digits", "synthetic"} <= set(available_datasets())


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'mnist'; available: .*digits"):
        load_dataset("mnist")


def test_unknown_parameter_is_named():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) alpah; accepted: .*alpha"):
        load_dataset("synthetic", alpah=1.0)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed"):
        load_dataset("digits", seed=seed)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def test_digits_shapes(digits):
    assert digits.input_shape == (1, 8, 8) and digits.num_classes == 10
    assert digits.x_train.shape == (1437, 1, 8, 8) and digits.x_test.shape == (360, 1, 8, 8)
    assert digits.x_train.dtype == torch.float32 and digits.y_test.dtype == torch.int64
    assert abs(digits.x_train.mean().item()) < 1e-4 and abs(digits.x_train.std().item() - 1) < 1e-3
    assert set(digits.y_test.tolist()) == set(range(10))  # stratified split
    assert digits.natural_partition is None and digits.num_clients is None


def test_digits_split_is_seeded(digits):
    again = load_dataset("digits", seed=0)
    other = load_dataset("digits", seed=1)
    assert torch.equal(digits.x_train, again.x_train)
    assert not np.array_equal(digits.extra["test_index"], other.extra["test_index"])
    with pytest.raises(ValueError, match=r"test_fraction=1\.5"):
        load_dataset("digits", test_fraction=1.5)


def test_dataset_validates_shapes():
    x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="does not match"):
        Dataset("t", x, y, x, y, num_classes=2, input_shape=(5,))
    with pytest.raises(ValueError, match="outside"):
        Dataset("t", x, y + 3, x, y, num_classes=2, input_shape=(3,))
    with pytest.raises(ValueError, match="float32"):
        Dataset("t", x.double(), y, x, y, num_classes=2, input_shape=(3,))


def test_synthetic_shapes_and_natural_partition():
    ds = load_dataset("synthetic", num_clients=20, alpha=0.5, beta=0.5, seed=3)
    assert ds.input_shape == (60,) and ds.num_classes == 10
    assert ds.x_train.shape[1] == 60 and ds.x_train.dtype == torch.float32
    assert ds.num_clients == 20 and len(ds.natural_test_partition) == 20
    train_idx = np.concatenate(ds.natural_partition)
    np.testing.assert_array_equal(np.sort(train_idx), np.arange(ds.num_train))
    np.testing.assert_array_equal(
        np.sort(np.concatenate(ds.natural_test_partition)), np.arange(ds.num_test)
    )
    pairs = zip(ds.natural_partition, ds.natural_test_partition, strict=True)
    for k, (tr, te) in enumerate(pairs):
        assert np.all(ds.writer_ids[tr] == k)
        n = len(tr) + len(te)
        assert n >= 50 and len(te) == round(0.1 * n)  # FedProx: lognormal(4, 2) + 50, 90/10
    assert int(ds.y_train.min()) >= 0 and int(ds.y_train.max()) < 10


def test_synthetic_is_deterministic_per_seed():
    a = generate_synthetic(num_clients=10, alpha=1, beta=1, seed=7)
    b = generate_synthetic(num_clients=10, alpha=1, beta=1, seed=7)
    c = generate_synthetic(num_clients=10, alpha=1, beta=1, seed=8)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert a.x_train.shape != c.x_train.shape or not np.array_equal(a.x_train, c.x_train)


def _client_means(data):
    return np.stack([data.x_train[idx].mean(axis=0) for idx in data.train_partition])


def test_synthetic_beta_spreads_client_features_and_iid_does_not():
    kw = dict(num_clients=30, alpha=0.0, seed=1, max_samples=400)
    spread = [_client_means(generate_synthetic(beta=b, **kw)).std(axis=0).mean() for b in (0, 2)]
    assert spread[1] > 1.5 * spread[0]
    iid = generate_synthetic(iid=True, **kw)
    assert np.abs(_client_means(iid)).mean() < 0.5  # v = 0 for every client


def test_synthetic_alpha_shift_cancels_in_argmax():
    # Faithful to the reference generator: u_k shifts every entry of W_k and b_k, which
    # adds the same amount to every class logit, so labels do not depend on alpha.
    a0 = generate_synthetic(num_clients=10, alpha=0.0, beta=1.0, seed=2)
    a2 = generate_synthetic(num_clients=10, alpha=2.0, beta=1.0, seed=2)
    np.testing.assert_array_equal(a0.x_train, a2.x_train)
    np.testing.assert_array_equal(a0.y_train, a2.y_train)


def test_synthetic_caps_and_validation():
    d = generate_synthetic(num_clients=40, seed=0, max_samples=120)
    assert max(len(t) for t in d.train_partition) <= 120
    bad = {"alpha": -1, "num_clients": 0, "test_fraction": 1.0, "min_samples": 1}
    for field, value in bad.items():
        with pytest.raises(ValueError, match=f"synthetic: {field}="):
            generate_synthetic(**{field: value})
