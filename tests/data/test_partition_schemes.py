"""Partition properties: disjoint, covering, sized, deterministic, and skewed as promised."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedveil.data.partition import SCHEMES, partition, partition_report

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def problems(draw, scheme: str):
    n = draw(st.integers(1, 300))
    num_classes = draw(st.integers(1, 8))
    labels = draw(arrays(np.int64, n, elements=st.integers(0, num_classes - 1)))
    params: dict = {}
    if scheme == "dirichlet":
        params = {"alpha": draw(st.floats(0.05, 50)), "min_size": 0}
    elif scheme == "shards":
        params = {"shards_per_client": draw(st.integers(1, min(3, n)))}
        n_max = n // params["shards_per_client"]
    elif scheme == "lognormal":
        params = {"sigma": draw(st.floats(0, 3)), "min_size": draw(st.integers(0, 1))}
    elif scheme == "writer":
        params = {"sigma": draw(st.floats(0, 1.5)), "label_alpha": draw(st.floats(0.5, 50))}
    num_clients = draw(st.integers(1, min(n if scheme != "shards" else n_max, 15)))
    seed = draw(st.integers(0, 2**32 - 1))
    return labels, num_clients, seed, params


def _check_basic(parts, n, num_clients):
    assert len(parts) == num_clients
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)  # sorted, unique
    flat = np.concatenate(parts)
    assert len(flat) == n  # disjoint + (with the next line) covering
    np.testing.assert_array_equal(np.sort(flat), np.arange(n))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_disjoint_covering_deterministic(scheme):
    @PROPS
    @given(problems(scheme))
    def check(problem):
        labels, k, seed, params = problem
        parts = partition(labels, k, scheme, seed, **params)
        _check_basic(parts, len(labels), k)
        again = partition(labels, k, scheme, seed, **params)
        assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
        sizes = np.array([len(p) for p in parts])
        if scheme == "iid":
            assert sizes.max() - sizes.min() <= 1
        elif scheme in ("lognormal", "dirichlet"):
            assert sizes.min() >= params["min_size"]
        elif scheme == "writer":
            assert sizes.min() >= 1
        elif scheme == "shards":
            spc = params["shards_per_client"]
            assert sizes.min() >= spc  # every shard holds at least one sample
            if k * spc >= len(np.unique(labels)):
                assert max(len(np.unique(labels[p])) for p in parts) <= spc

    check()


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_different_seed_gives_different_partition(scheme):
    labels = np.repeat(np.arange(10), 100)
    a = partition(labels, 10, scheme, 0)
    b = partition(labels, 10, scheme, 1)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_labels_may_be_arbitrary_ids_or_tensors():
    import torch

    ids = np.array([-5, 7, 7, 100, -5, 100] * 10)
    parts = partition(ids, 3, "shards", 0, shards_per_client=1)
    assert [len(np.unique(ids[p])) for p in parts] == [1, 1, 1]
    t = partition(torch.from_numpy(ids), 3, "shards", 0, shards_per_client=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, t, strict=True))


def _mean_tv(labels, scheme, seeds=range(4), **params) -> float:
    reports = [
        partition_report(partition(labels, 20, scheme, s, **params), labels, 10) for s in seeds
    ]
    return float(np.mean([r["summary"]["tv_mean"] for r in reports]))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = np.repeat(np.arange(10), 500)
    tvs = [_mean_tv(labels, "dirichlet", alpha=a) for a in (100.0, 1.0, 0.3, 0.05)]
    assert tvs == sorted(tvs) and tvs[-1] > 3 * tvs[0]
    assert tvs[0] < _mean_tv(labels, "iid") + 0.05  # large alpha approaches IID


def test_dirichlet_min_size_is_honoured_by_resampling():
    labels = np.repeat(np.arange(10), 100)
    for seed in range(5):
        parts = partition(labels, 20, "dirichlet", seed, alpha=0.2, min_size=20)
        assert min(len(p) for p in parts) >= 20


def test_dirichlet_gives_up_with_a_clear_error():
    labels = np.repeat(np.arange(10), 10)
    with pytest.raises(ValueError, match="min_size=5 after max_retries=3"):
        partition(labels, 20, "dirichlet", 0, alpha=0.01, min_size=5, max_retries=3)


def test_shards_match_mcmahan_on_balanced_labels():
    labels = np.repeat(np.arange(10), 6000)  # Fashion-MNIST train label counts
    parts = partition(labels, 100, "shards", 0)  # 200 shards of 300
    assert {len(p) for p in parts} == {600}
    per_client = [np.unique(labels[p], return_counts=True) for p in parts]
    assert all(len(u) <= 2 and all(c % 300 == 0 for c in cnt) for u, cnt in per_client)
    assert np.mean([len(u) for u, _ in per_client]) > 1.7  # mostly two distinct labels


def test_shards_with_fewer_shards_than_labels_still_cover():
    labels = np.repeat(np.arange(10), 30)
    _check_basic(partition(labels, 2, "shards", 0, shards_per_client=2), 300, 2)


def _size_cv(sigma: float, seed: int) -> float:
    parts = partition(np.zeros(20_000, dtype=np.int64), 50, "lognormal", seed, sigma=sigma)
    sizes = np.array([len(p) for p in parts])
    return float(sizes.std() / sizes.mean())


def test_lognormal_size_spread_grows_with_sigma():
    for seed in range(3):
        cvs = [_size_cv(s, seed) for s in (0.0, 0.3, 0.8, 1.5)]
        assert cvs[0] < 0.01 and cvs == sorted(cvs) and cvs[-1] > 1.0


def test_lognormal_keeps_labels_iid():
    labels = np.repeat(np.arange(10), 500)
    assert _mean_tv(labels, "lognormal", sigma=0.5) < 0.2


def test_writer_skew_is_mild():
    labels = np.repeat(np.arange(10), 500)
    iid, writer = _mean_tv(labels, "iid"), _mean_tv(labels, "writer")
    dirichlet = _mean_tv(labels, "dirichlet", alpha=0.5)
    assert iid < writer < dirichlet
    cvs = [
        np.std(s) / np.mean(s)
        for s in ([len(p) for p in partition(labels, 50, "writer", seed)] for seed in range(3))
    ]
    assert 0.2 < np.mean(cvs) < 0.7  # FEMNIST writers: std/mean ~ 0.39


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda y: partition(y, 5, "dirichlet", 0, alpha=0), r"alpha=0 must be finite and > 0"),
        (lambda y: partition(y, 5, "dirichlet", 0, alpha=-1.0), r"alpha=-1\.0 must be"),
        (lambda y: partition(y, 101, "iid", 0), r"num_clients=101 exceeds the number of samples"),
        (lambda y: partition(y, 0, "iid", 0), r"num_clients=0 must be >= 1"),
        (lambda y: partition(y, 5, "random", 0), r"unknown scheme 'random'; valid schemes: iid, "),
        (lambda y: partition(y, 5, "iid", 0, alpha=1), r"'iid': unknown parameter\(s\) alpha"),
        (lambda y: partition(y, 5, "iid", -1), r"seed=-1 must be a non-negative int"),
        (lambda y: partition(y.astype(float), 5, "iid", 0), r"integer dtype"),
        (lambda y: partition(y.reshape(10, 10), 5, "iid", 0), r"1-D"),
        (lambda y: partition(y, 60, "shards", 0), r"120 shards exceeds the 100 samples"),
        (lambda y: partition(y, 5, "shards", 0, shards_per_client=0), r"shards_per_client=0"),
        (lambda y: partition(y, 5, "lognormal", 0, sigma=-1), r"sigma=-1 must be"),
        (lambda y: partition(y, 5, "dirichlet", 0, min_size=30), r"min_size=30 x num_clients=5"),
        (lambda y: partition(y, 5, "writer", 0, label_alpha=0), r"label_alpha=0 must be"),
    ],
)
def test_validation_errors_name_field_and_limit(call, message):
    with pytest.raises(ValueError, match=message):
        call(np.repeat(np.arange(10), 10))
