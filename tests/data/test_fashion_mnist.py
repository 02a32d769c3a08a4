"""Fashion-MNIST discovery, error messages, decoding cache and explicit download."""

from pathlib import Path

import numpy as np
import pytest
import torch

from fedveil.data import fashion_mnist as fm
from fedveil.data.datasets import DatasetNotFoundError, load_dataset
from fedveil.data.idx import IdxFormatError, write_idx

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
NAMES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]
have_debian = pytest.mark.skipif(
    not all((DEBIAN_DIR / n).is_file() for n in NAMES),
    reason="Debian package dataset-fashion-mnist not installed",
)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No dataset anywhere on the search path; caches go to tmp."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDVEIL_DATA", str(tmp_path / "env-data"))
    monkeypatch.setattr(fm, "SYSTEM_DIRS", (tmp_path / "system",))
    return tmp_path


def test_not_found_message_says_how_to_get_it(isolated):
    empty = isolated / "empty"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion-mnist", data_dir=empty)
    msg = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "fedveil data download fashion-mnist" in msg
    assert "FEDVEIL_DATA" in msg
    # an explicit directory is the only place looked at
    assert str(empty) in msg and str(isolated / "system") not in msg
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion-mnist")
    msg = str(info.value)
    for searched in [
        isolated / "env-data",
        isolated / "cache" / "fedveil" / "fashion-mnist",
        isolated / "system",
    ]:
        assert str(searched) in msg
    assert isinstance(info.value, FileNotFoundError)


def test_partial_directory_is_reported(isolated):
    partial = isolated / "partial"
    partial.mkdir()
    (partial / NAMES[0]).write_bytes(b"")
    with pytest.raises(DatasetNotFoundError, match=r"partial: missing .*t10k-labels"):
        fm.find_fashion_mnist(partial)


def _touch_all(directory: Path, raw: bool = False) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        (directory / (name.removesuffix(".gz") if raw else name)).write_bytes(b"")


def test_search_order(isolated, monkeypatch):
    explicit, env, cache, system = (isolated / d for d in ("explicit", "env", "cache", "system"))
    monkeypatch.setenv("FEDVEIL_DATA", str(env))
    _touch_all(system)
    assert fm.find_fashion_mnist()["x_train"].parent == system
    _touch_all(cache / "fedveil" / "fashion-mnist")
    assert fm.find_fashion_mnist()["x_train"].parent == cache / "fedveil" / "fashion-mnist"
    _touch_all(env / "fashion-mnist", raw=True)  # the subfolder form, gunzipped names
    found = fm.find_fashion_mnist()
    assert found["x_train"] == env / "fashion-mnist" / "train-images-idx3-ubyte"
    _touch_all(explicit)
    assert fm.find_fashion_mnist(explicit)["y_test"].parent == explicit


def test_corrupt_file_gives_clear_error(isolated):
    bad = isolated / "bad"
    _touch_all(bad)
    (bad / NAMES[0]).write_bytes(bytes.fromhex("deadbeef"))
    with pytest.raises(IdxFormatError, match=r"train-images-idx3-ubyte\.gz: bad magic"):
        load_dataset("fashion-mnist", data_dir=bad)


def test_wrong_record_count_is_rejected(isolated):
    small = isolated / "small"
    small.mkdir()
    write_idx(small / NAMES[0], np.zeros((5, 28, 28), dtype=np.uint8))
    for name in NAMES[1:]:
        (small / name).write_bytes(b"")
    expected = "5 records in train-images-idx3-ubyte, expected 60000"
    with pytest.raises(IdxFormatError, match=expected):
        load_dataset("fashion-mnist", data_dir=small)


@pytest.fixture(scope="module")
def debian_loads(tmp_path_factory):
    """Load twice with an empty cache dir: (first, second, cache dir)."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(cache))
        mp.delenv("FEDVEIL_DATA", raising=False)
        first = load_dataset("fashion-mnist", data_dir=DEBIAN_DIR)
        second = load_dataset("fashion-mnist", data_dir=DEBIAN_DIR)
    return first, second, cache


@have_debian
def test_debian_files_load(debian_loads):
    ds, _, _ = debian_loads
    assert (ds.num_train, ds.num_test) == (60_000, 10_000)
    assert ds.x_train.shape == (60_000, 1, 28, 28) and ds.x_test.shape == (10_000, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10  # Fashion-MNIST is balanced
    assert abs(ds.x_train.mean().item()) < 0.01 and abs(ds.x_train.std().item() - 1) < 0.01
    assert ds.y_train[:5].tolist() == [9, 0, 0, 3, 0]  # first labels of the official file


@have_debian
def test_second_load_uses_decoded_cache(debian_loads):
    first, second, cache = debian_loads
    assert first.extra["from_cache"] is False and second.extra["from_cache"] is True
    assert len(list((cache / "fedveil" / "decoded").glob("fashion-mnist-*.npz"))) == 1
    assert torch.equal(first.x_train, second.x_train) and torch.equal(first.y_test, second.y_test)


@have_debian
def test_corrupt_cache_is_ignored_and_rewritten(debian_loads, monkeypatch):
    _, _, cache = debian_loads
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    [npz] = (cache / "fedveil" / "decoded").glob("fashion-mnist-*.npz")
    npz.write_bytes(b"not a zip file")
    arrays = fm.load_fashion_mnist_arrays(DEBIAN_DIR)
    assert not arrays.from_cache and arrays.x_train.shape == (60_000, 28, 28)
    assert fm.load_fashion_mnist_arrays(DEBIAN_DIR).from_cache


def _mirror(tmp_path: Path) -> Path:
    """A local file:// mirror with small stand-in files (never the network)."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for i, name in enumerate(NAMES):
        (mirror / name).write_bytes(bytes([i]) * 100)
    return mirror


def test_download_rejects_checksum_mismatch(tmp_path):
    mirror, dest = _mirror(tmp_path), tmp_path / "dest"
    with pytest.raises(fm.DatasetDownloadError, match="checksum mismatch"):
        fm.download_fashion_mnist(dest, base_url=mirror.as_uri())
    assert list(dest.iterdir()) == []  # no partial or unverified files left behind


def test_download_verifies_and_keeps_good_files(tmp_path, monkeypatch):
    mirror, dest = _mirror(tmp_path), tmp_path / "dest"
    sums = {name: fm._digests(mirror / name) for name in NAMES}
    monkeypatch.setattr(fm, "_CHECKSUMS", sums)
    assert fm.download_fashion_mnist(dest, base_url=mirror.as_uri()) == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(NAMES)
    (mirror / NAMES[0]).unlink()  # already verified locally: no refetch needed
    fm.download_fashion_mnist(dest, base_url=mirror.as_uri())


def test_download_reports_unreachable_mirror(tmp_path):
    with pytest.raises(fm.DatasetDownloadError, match="could not download"):
        fm.download_fashion_mnist(tmp_path / "d", base_url=(tmp_path / "nowhere").as_uri())
