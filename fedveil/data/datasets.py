"""Offline datasets behind one registry (simulations train on them, the coordinator tests).

``load_dataset(name, data_dir=..., seed=..., **params)`` returns a :class:`Dataset`
of ready-to-train torch tensors. Nothing is ever downloaded here: a missing dataset
raises :class:`DatasetNotFoundError` with instructions.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedveil.data.dataset_errors import DatasetNotFoundError
from fedveil.data.fashion_mnist import FASHION_MNIST_CLASSES, load_fashion_mnist_arrays
from fedveil.data.pixels import FASHION_MNIST_MEAN, FASHION_MNIST_STD, standardize_pixels
from fedveil.data.synthetic import generate_synthetic

__all__ = [
    "Dataset",
    "DatasetNotFoundError",
    "available_datasets",
    "load_dataset",
    "register_dataset",
]


@dataclass
class Dataset:
    """Train/test tensors plus what a round engine needs to build clients.

    Images are ``N x C x H x W`` float32 (normalised), tabular data ``N x F``;
    labels are int64 in ``[0, num_classes)``. Datasets that come naturally
    partitioned (``synthetic``) also carry ``natural_partition`` (train indices
    per client), ``natural_test_partition`` and per-sample ``writer_ids``.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    writer_ids: np.ndarray | None = None
    natural_partition: list[np.ndarray] | None = None
    natural_test_partition: list[np.ndarray] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Catch loader bugs here rather than as shape errors deep inside a round.
        for split in ("train", "test"):
            x: torch.Tensor = getattr(self, f"x_{split}")
            y: torch.Tensor = getattr(self, f"y_{split}")
            if x.dtype != torch.float32:
                raise ValueError(f"{self.name}: x_{split}.dtype={x.dtype}, expected float32")
            if y.dtype != torch.int64 or y.ndim != 1:
                raise ValueError(
                    f"{self.name}: y_{split} must be 1-D int64, got {y.dtype} {y.ndim}-D"
                )
            if x.shape[0] != y.shape[0] or tuple(x.shape[1:]) != self.input_shape:
                raise ValueError(
                    f"{self.name}: x_{split} shape {tuple(x.shape)} does not match "
                    f"{y.shape[0]} labels of input_shape {self.input_shape}"
                )
            if y.numel() and not 0 <= int(y.min()) <= int(y.max()) < self.num_classes:
                raise ValueError(f"{self.name}: y_{split} outside [0, {self.num_classes})")
        if self.writer_ids is not None and len(self.writer_ids) != len(self.y_train):
            raise ValueError(
                f"{self.name}: writer_ids has {len(self.writer_ids)} entries, "
                f"expected one per training sample ({len(self.y_train)})"
            )

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])

    @property
    def num_clients(self) -> int | None:
        """Number of natural clients, or None when the dataset is not naturally split."""
        return None if self.natural_partition is None else len(self.natural_partition)


Loader = Callable[..., Dataset]
_REGISTRY: dict[str, Loader] = {}


def register_dataset(name: str, loader: Loader) -> None:
    """Register ``loader(*, data_dir, seed, **params) -> Dataset`` under ``name``."""
    if name in _REGISTRY:
        raise ValueError(f"dataset {name!r} is already registered")
    _REGISTRY[name] = loader


def available_datasets() -> list[str]:
    return sorted(_REGISTRY)


def _check_params(name: str, loader: Loader, params: dict[str, Any]) -> None:
    accepted = [p for p in inspect.signature(loader).parameters if p not in ("data_dir", "seed")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"dataset {name!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )


def load_dataset(
    name: str, *, data_dir: str | os.PathLike[str] | None = None, seed: int = 0, **params: Any
) -> Dataset:
    """Load a registered dataset. ``seed`` fixes splits and generated data."""
    loader = _REGISTRY.get(name)
    if loader is None:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    _check_params(name, loader, params)
    return loader(data_dir=data_dir, seed=int(seed), **params)


def _images_to_tensor(images: np.ndarray, scale: float, mean: float, std: float) -> torch.Tensor:
    return standardize_pixels(images, scale, mean, std).unsqueeze(1)  # N x 1 x H x W


def _load_fashion_mnist(
    *,
    data_dir: str | os.PathLike[str] | None,
    seed: int,
    normalize: bool = True,
    use_cache: bool = True,
) -> Dataset:
    del seed  # fixed official train/test split
    arrays = load_fashion_mnist_arrays(data_dir, use_cache=use_cache)
    mean, std = (FASHION_MNIST_MEAN, FASHION_MNIST_STD) if normalize else (0.0, 1.0)
    return Dataset(
        name="fashion-mnist",
        x_train=_images_to_tensor(arrays.x_train, 255.0, mean, std),
        y_train=torch.from_numpy(arrays.y_train.astype(np.int64)),
        x_test=_images_to_tensor(arrays.x_test, 255.0, mean, std),
        y_test=torch.from_numpy(arrays.y_test.astype(np.int64)),
        num_classes=10,
        input_shape=(1, 28, 28),
        extra={
            "class_names": FASHION_MNIST_CLASSES,
            "pixel_mean": mean,
            "pixel_std": std,
            "source": str(arrays.source),
            "from_cache": arrays.from_cache,
        },
    )


def _load_digits(
    *, data_dir: str | os.PathLike[str] | None, seed: int, test_fraction: float = 0.2
) -> Dataset:
    del data_dir  # bundled with scikit-learn
    from sklearn.datasets import load_digits  # local: sklearn import is slow and optional
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"digits: test_fraction={test_fraction} must be in (0, 1)")
    bunch = load_digits()
    images = bunch.images.astype(np.float32)  # 1797 x 8 x 8, values 0..16
    labels = bunch.target.astype(np.int64)
    # Stratified so every class appears in test even for small test fractions.
    tr, te = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, random_state=seed, stratify=labels
    )
    scaled = images[tr] / 16.0
    mean, std = float(scaled.mean()), float(scaled.std())  # train-only stats: no test leakage
    return Dataset(
        name="digits",
        x_train=_images_to_tensor(images[tr], 16.0, mean, std),
        y_train=torch.from_numpy(labels[tr]),
        x_test=_images_to_tensor(images[te], 16.0, mean, std),
        y_test=torch.from_numpy(labels[te]),
        num_classes=10,
        input_shape=(1, 8, 8),
        extra={"pixel_mean": mean, "pixel_std": std, "train_index": tr, "test_index": te},
    )


def _load_synthetic(
    *,
    data_dir: str | os.PathLike[str] | None,
    seed: int,
    num_clients: int = 30,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    num_features: int = 60,
    num_classes: int = 10,
    size_mean: float = 4.0,
    size_sigma: float = 2.0,
    min_samples: int = 50,
    max_samples: int | None = None,
    test_fraction: float = 0.1,
) -> Dataset:
    del data_dir  # generated
    s = generate_synthetic(
        num_clients=num_clients, alpha=alpha, beta=beta, iid=iid, seed=seed,
        num_features=num_features, num_classes=num_classes, size_mean=size_mean,
        size_sigma=size_sigma, min_samples=min_samples, max_samples=max_samples,
        test_fraction=test_fraction,
    )  # fmt: skip
    writer_ids = np.empty(len(s.y_train), dtype=np.int64)
    for client, idx in enumerate(s.train_partition):
        writer_ids[idx] = client
    name = "synthetic-iid" if iid else f"synthetic({alpha:g},{beta:g})"
    return Dataset(
        name=name,
        x_train=torch.from_numpy(s.x_train),
        y_train=torch.from_numpy(s.y_train),
        x_test=torch.from_numpy(s.x_test),
        y_test=torch.from_numpy(s.y_test),
        num_classes=num_classes,
        input_shape=(num_features,),
        writer_ids=writer_ids,
        natural_partition=s.train_partition,
        natural_test_partition=s.test_partition,
        extra={"alpha": alpha, "beta": beta, "iid": iid},
    )


register_dataset("fashion-mnist", _load_fashion_mnist)
register_dataset("digits", _load_digits)
register_dataset("synthetic", _load_synthetic)
