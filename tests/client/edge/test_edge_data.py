"""Local data on a device: NPZ, CSV and IDX give the same tensors; bad files are named."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from deploy_task import arrays, write_client_file, write_idx

from fedveil.client.edge.edge_data import DataError, load_local_data, read_idx, with_holdout
from fedveil.data.datasets import load_dataset
from fedveil.data.pixels import FASHION_MNIST_MEAN, FASHION_MNIST_STD

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.parametrize("fmt", ["npz", "csv", "idx"])
def test_every_format_gives_the_same_examples(tmp_path, fmt):
    x, y = arrays(5)[0][3]
    data = load_local_data(write_client_file(tmp_path, 5, 3, fmt))
    assert data.x.dtype == torch.float32 and data.y.dtype == torch.int64
    torch.testing.assert_close(data.x, torch.from_numpy(x), rtol=0, atol=0)
    assert torch.equal(data.y, torch.from_numpy(y))


def test_fashion_mnist_style_idx_images(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=7).astype(np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte", images)
    raw = (tmp_path / "train-images-idx3-ubyte").read_bytes()
    (tmp_path / "train-images-idx3-ubyte").unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress((tmp_path / "train-labels-idx1-ubyte").read_bytes())
    )
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    data = load_local_data(tmp_path)  # the directory, as Debian's dataset-fashion-mnist has it
    assert tuple(data.x.shape) == (7, 1, 28, 28)
    expected = (images[2].astype(np.float32) / 255 - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
    np.testing.assert_allclose(data.x[2, 0].numpy(), expected, rtol=1e-6, atol=1e-6)
    assert data.y.tolist() == labels.tolist()


@pytest.mark.skipif(
    not (DEBIAN_FMNIST / "train-labels-idx1-ubyte.gz").is_file(),
    reason="Debian package dataset-fashion-mnist not installed",
)
def test_raw_fashion_mnist_on_a_device_is_the_simulations_training_set(tmp_path, monkeypatch):
    # Bit for bit, not to rounding: the device and the simulation standardise pixels by
    # the same code, so a device with the raw files trains the simulation's model.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ds = load_dataset("fashion-mnist", data_dir=DEBIAN_FMNIST, use_cache=False)
    data = load_local_data(DEBIAN_FMNIST)
    assert torch.equal(data.x, ds.x_train) and torch.equal(data.y, ds.y_train)


def test_npz_eval_split_and_holdout(tmp_path):
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.savez(tmp_path / "a.npz", x=x, y=np.arange(10) % 3, x_eval=x[:2], y_eval=np.array([0, 1]))
    data = load_local_data(tmp_path / "a.npz")
    assert len(data) == 10 and data.x_eval is not None and len(data.y_eval) == 2
    np.savez(tmp_path / "b.npz", x_train=x, y_train=np.arange(10) % 3)
    split = with_holdout(load_local_data(tmp_path / "b.npz"), 0.2)
    assert len(split) == 8 and len(split.x_eval) == 2
    assert torch.equal(split.x_eval, torch.from_numpy(x[:2]))  # as the simulation splits


def test_csv_label_column_by_name_or_last(tmp_path):
    (tmp_path / "named.csv").write_text("label,a,b\n1,0.5,2\n0,1.5,3\n")
    data = load_local_data(tmp_path / "named.csv")
    assert data.y.tolist() == [1, 0] and data.x.tolist() == [[0.5, 2.0], [1.5, 3.0]]
    (tmp_path / "plain.csv").write_text("0.5,2,1\n1.5,3,2\n")
    assert load_local_data(tmp_path / "plain.csv").y.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.npz", b"not a zip", "not a readable .npz"),
        ("a.csv", b"a,b\nx,y\n", "not a numeric CSV"),
        ("a.csv", b"0.5,1.5\n1,2.5\n", "whole numbers"),
        ("a.csv", b"nan,1\n1,2\n", "NaN"),
        ("a.csv", b"1\n2\n", "feature column"),
        ("a.csv", b"", "empty CSV"),
        ("a.bin", b"x", "unknown data format"),
        ("x-images-idx3-ubyte", b"\x00\x00\x08\x03\x00\x00\x00\x02", "truncated"),
        ("x-images-idx3-ubyte", b"\x01\x02\x08\x01\x00\x00\x00\x01\x05", "magic"),
        ("y-images-idx3-ubyte", b"\x00\x00\x08\x01\x00\x00\x00\x09\x05", "header shape"),
    ],
)
def test_bad_files_are_named(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    if "images" in name:  # a good labels file next to the broken images
        write_idx(tmp_path / name.replace("images-idx3", "labels-idx1"), np.zeros(2, np.uint8))
    with pytest.raises(DataError) as err:
        load_local_data(tmp_path / name)
    assert message in str(err.value) and name in str(err.value)


def test_missing_pieces(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_local_data(tmp_path / "nope.npz")
    np.savez(tmp_path / "k.npz", features=np.zeros((2, 2)))
    with pytest.raises(DataError, match="needs arrays 'x' and 'y'"):
        load_local_data(tmp_path / "k.npz")
    write_idx(tmp_path / "solo-images-idx3-ubyte", np.zeros((2, 3, 3), np.uint8))
    with pytest.raises(DataError, match="labels file"):
        load_local_data(tmp_path / "solo-images-idx3-ubyte")
    np.savez(tmp_path / "m.npz", x=np.zeros((3, 2), np.float32), y=np.array([0, 1]))
    with pytest.raises(DataError, match="2 labels"):
        load_local_data(tmp_path / "m.npz")
    np.savez(tmp_path / "n.npz", x=np.zeros((2, 2), np.float32), y=np.array([0, -1]))
    with pytest.raises(DataError, match="negative label"):
        load_local_data(tmp_path / "n.npz")
    assert read_idx is not None


def test_client_command_refuses_bad_arguments_before_starting(tmp_path, monkeypatch, fedveil_cli):
    # In process (main([...])): each refusal comes before anything is started.
    monkeypatch.chdir(tmp_path)

    def client(*args):
        return fedveil_cli("client", "--server", "127.0.0.1:9", *args)

    help_text = fedveil_cli("client", "--help").stdout
    for flag in (
        "--require-secagg",
        "--max-clip-norm",
        "--min-dp-noise",
        "--max-local-epochs",
        "--max-local-steps",
        "--max-train-seconds",
    ):
        assert flag in help_text
    r = client("--client-id", "0")
    assert r.returncode == 2 and "--data PATH" in r.stderr
    (tmp_path / "ok.csv").write_text("1,2,0\n3,4,1\n")
    r = client("--client-id", "0", "--data", "ok.csv", "--insecure", "--key", "ok.csv")
    assert r.returncode == 2 and "--key needs TLS" in r.stderr
