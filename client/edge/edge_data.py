"""A device's local training data: NPZ, CSV or IDX (Fashion-MNIST style) files.

Whatever the format, the result is float32 features (N x F, or N x C x H x W
for images) and int64 labels, checked once at start-up so a bad file fails
before the device joins any run, with a message naming the file and the check.

- NPZ: arrays `x` and `y` (or `x_train`/`y_train`); optional `x_eval`/`y_eval`.
- CSV: numeric columns; the label is the column named label/y/target (header
  row optional), else the last column.
- IDX: a directory with `*images-idx3-ubyte[.gz]` and `*labels-idx1-ubyte[.gz]`
  (train-* preferred), or the images file itself (the labels file is found
  next to it).
Unsigned 8-bit images (IDX or NPZ) are scaled to [0, 1] and standardised with
the Fashion-MNIST statistics fedveil's built-in dataset uses, by the same code
(`fedveil.data`, as is the IDX reader), so a device with raw Fashion-MNIST
files gets the very tensors the simulation trains on.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
import torch

from fedveil.data import idx
from fedveil.data.pixels import FASHION_MNIST_MEAN, FASHION_MNIST_STD, standardize_pixels
from fedveil.tasks import ClientData

LABEL_COLUMNS = ("label", "y", "target")


class DataError(ValueError):
    """Local data cannot be used: names the file and what is wrong."""


def _open(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if path.suffix == ".gz":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataError(f"{path}: not a valid gzip file ({exc})") from None
    return raw


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (raw or gzip) through `fedveil.data.idx`; its errors become DataError."""
    try:
        return idx.read_idx(path)
    except idx.IdxFormatError as exc:
        raise DataError(str(exc)) from None  # the message starts with the path
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _features(x: np.ndarray, source: Path) -> torch.Tensor:
    if x.ndim < 2:
        raise DataError(f"{source}: features must have at least 2 dimensions, got shape {x.shape}")
    if x.dtype == np.uint8:
        x = standardize_pixels(x, 255.0, FASHION_MNIST_MEAN, FASHION_MNIST_STD).numpy()
    elif not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"{source}: features have dtype {x.dtype}; expected numbers")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 3:  # N x H x W images get their channel dimension
        x = x[:, None, :, :]
    if not np.isfinite(x).all():
        raise DataError(f"{source}: features contain NaN or Inf")
    return torch.from_numpy(x)


def _labels(y: np.ndarray, n: int, source: Path) -> torch.Tensor:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        raise DataError(f"{source}: {len(y)} labels of shape {y.shape} for {n} examples")
    if np.issubdtype(y.dtype, np.floating):
        if not np.isfinite(y).all() or not np.equal(np.mod(y, 1), 0).all():
            raise DataError(f"{source}: labels must be whole numbers")
    elif not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{source}: labels have dtype {y.dtype}; expected integers")
    y = y.astype(np.int64)
    if n and y.min() < 0:
        raise DataError(f"{source}: negative label {int(y.min())}")
    return torch.from_numpy(y)


def _pair(x: np.ndarray, y: np.ndarray, source: Path) -> tuple[torch.Tensor, torch.Tensor]:
    xt = _features(x, source)
    if xt.shape[0] == 0:
        raise DataError(f"{source}: no examples")
    return xt, _labels(y, xt.shape[0], source)


def load_npz(path: Path) -> ClientData:
    try:
        with np.load(io.BytesIO(_open(path)), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from None
    for xk, yk in (("x", "y"), ("x_train", "y_train")):
        if xk in arrays and yk in arrays:
            x, y = _pair(arrays[xk], arrays[yk], path)
            break
    else:
        raise DataError(
            f"{path}: needs arrays 'x' and 'y' (or 'x_train', 'y_train'); has {sorted(arrays)}"
        )
    for xk, yk in (("x_eval", "y_eval"), ("x_test", "y_test")):
        if xk in arrays and yk in arrays:
            xe, ye = _pair(arrays[xk], arrays[yk], path)
            if xe.shape[1:] != x.shape[1:]:
                raise DataError(
                    f"{path}: {xk} shape {tuple(xe.shape[1:])} differs from training data"
                )
            return ClientData(x, y, xe, ye)
    return ClientData(x, y)


def load_csv(path: Path) -> ClientData:
    text = _open(path).decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise DataError(f"{path}: empty CSV file")
    first = [c.strip().strip('"').lower() for c in lines[0].split(",")]
    label_col = len(first) - 1
    body = lines
    try:
        [float(c) for c in first]
    except ValueError:
        body = lines[1:]  # a header row
        for name in LABEL_COLUMNS:
            if name in first:
                label_col = first.index(name)
                break
    try:
        table = np.loadtxt(io.StringIO("\n".join(body)), delimiter=",", dtype=np.float64, ndmin=2)
    except ValueError as exc:
        raise DataError(f"{path}: not a numeric CSV table ({exc})") from None
    if table.shape[1] < 2:
        raise DataError(f"{path}: needs at least one feature column and a label column")
    y = table[:, label_col]
    x = np.delete(table, label_col, axis=1)
    xt, yt = _pair(x.astype(np.float32), y, path)
    return ClientData(xt, yt)


def _idx_files(path: Path) -> tuple[Path, Path]:
    if path.is_dir():
        images = sorted(path.glob("*images-idx*-ubyte*")) + sorted(path.glob("*images.idx*"))
        if not images:
            raise DataError(f"{path}: no '*images-idx3-ubyte[.gz]' file in this directory")
        train = [p for p in images if p.name.startswith("train")]
        path = (train or images)[0]
    name = path.name
    for a, b in (("images-idx3", "labels-idx1"), ("images", "labels")):
        if a in name:
            labels = path.with_name(name.replace(a, b, 1))
            if labels.exists():
                return path, labels
    raise DataError(f"{path}: cannot find the matching labels file (…labels-idx1-ubyte)")


def load_idx(path: Path) -> ClientData:
    images, labels = _idx_files(path)
    x, y = _pair(read_idx(images), read_idx(labels), images)
    return ClientData(x, y)


def load_local_data(path: str | Path) -> ClientData:
    """The device's data from `path` (format from the name; see module doc)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    name = p.name.lower().removesuffix(".gz")
    if name.endswith(".npz"):
        return load_npz(p)
    if name.endswith(".csv"):
        return load_csv(p)
    if p.is_dir() or "idx" in name:
        return load_idx(p)
    raise DataError(f"{p}: unknown data format; use .npz, .csv or IDX files (a directory of them)")


def with_holdout(data: ClientData, holdout: float) -> ClientData:
    """Split off the first share of examples for local evaluation, as the simulation does."""
    n = len(data)
    if data.x_eval is not None or holdout <= 0 or n < 2:
        return data
    k = max(1, round(holdout * n))
    return ClientData(data.x[k:], data.y[k:], data.x[:k], data.y[:k])
