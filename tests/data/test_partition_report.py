"""partition_report / format_partition_report on hand-made partitions."""

import json

import numpy as np
import pytest

from fedveil.data.partition import format_partition_report, partition, partition_report


def test_counts_histograms_and_distances():
    labels = np.array([0, 0, 1, 1, 2, 2])
    parts = [np.array([0, 1]), np.array([2, 3, 4, 5]), np.array([], dtype=np.int64)]
    r = partition_report(parts, labels, num_classes=3)
    assert (r["num_clients"], r["num_samples"], r["unassigned"], r["duplicated"]) == (3, 6, 0, 0)
    c0, c1, c2 = r["clients"]
    assert c0["label_counts"] == [2, 0, 0] and c0["num_classes"] == 1
    assert c0["tv"] == pytest.approx(2 / 3) and c0["emd"] == pytest.approx(4 / 3)
    assert c1["label_counts"] == [0, 2, 2] and c1["tv"] == pytest.approx(1 / 3)
    assert c2["size"] == 0 and c2["tv"] is None
    s = r["summary"]
    assert (s["size_min"], s["size_median"], s["size_max"], s["empty_clients"]) == (0, 2.0, 4, 1)
    assert s["classes_per_client_mean"] == pytest.approx(1.0)
    assert s["tv_mean"] == pytest.approx(0.5) and s["tv_max"] == pytest.approx(2 / 3)
    assert s["tv_weighted"] == pytest.approx((2 * 2 / 3 + 4 * 1 / 3) / 6)
    json.dumps(r)  # plain Python types only, so the CLI can emit JSON


def test_detects_gaps_and_overlaps():
    labels = np.zeros(5, dtype=np.int64)
    r = partition_report([np.array([0, 1]), np.array([1, 2])], labels, num_classes=1)
    assert (r["assigned"], r["unassigned"], r["duplicated"]) == (3, 2, 1)


def test_iid_partition_is_close_to_global():
    labels = np.repeat(np.arange(10), 1000)
    r = partition_report(partition(labels, 10, "iid", 0), labels, 10)
    assert r["summary"]["tv_max"] < 0.05 and r["summary"]["classes_per_client_mean"] == 10


def test_rejects_out_of_range_input():
    with pytest.raises(ValueError, match="num_classes=2"):
        partition_report([np.array([0])], np.array([5]), num_classes=2)
    with pytest.raises(ValueError, match="partition 0 has indices outside"):
        partition_report([np.array([3])], np.array([0, 1]), num_classes=2)


def test_format_is_readable_and_truncates():
    labels = np.repeat(np.arange(4), 25)
    text = format_partition_report(
        partition_report(partition(labels, 30, "dirichlet", 0, alpha=0.5, min_size=1), labels, 4),
        max_clients=5,
    )
    assert text.splitlines()[0].startswith("30 clients, 100 samples, 4 classes")
    assert "label skew vs global: TV mean" in text and "... 25 more clients" in text
    assert len(text.splitlines()) == 4 + 2 + 5 + 1
