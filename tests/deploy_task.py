"""Gaussian blobs with a *built-in* model (the run's model.name) for deployment tests.

Devices can join a run of this task either with the task itself
(`--task deploy_task:make`) or with their share written to local files
(`--data c3.npz|.csv|IDX`): both train the same model on the same examples,
so a deployment mixing them must reproduce the simulation exactly.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

from fedveil.builtin_models import build_model
from fedveil.config import RunConfig
from fedveil.tasks import ClientData, Task

FEATURES, CLASSES = 8, 3


def _blobs(n: int, rng: np.random.Generator, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, CLASSES, size=n)
    x = (centers[y] + rng.normal(size=(n, FEATURES))).astype(np.float32)
    return x, y.astype(np.int64)


def arrays(
    num_clients: int,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(4321)
    centers = rng.normal(scale=2.0, size=(CLASSES, FEATURES))
    clients = [_blobs(int(rng.integers(30, 70)), rng, centers) for _ in range(num_clients)]
    return clients, _blobs(300, rng, centers)


def make(cfg: RunConfig) -> Task:
    clients, (xt, yt) = arrays(cfg.data.num_clients)
    name = cfg.model.name

    def client_data(cid: int) -> ClientData:
        x, y = clients[cid]
        return ClientData(torch.from_numpy(x), torch.from_numpy(y))

    return Task(
        name=f"deploy-blobs/{name}",
        input_shape=(FEATURES,),
        num_classes=CLASSES,
        num_clients=cfg.data.num_clients,
        model_fn=lambda: build_model(name, (FEATURES,), CLASSES),
        client_data=client_data,
        test_data=(torch.from_numpy(xt), torch.from_numpy(yt)),
        client_sizes=np.array([len(c[1]) for c in clients]),
    )


def write_idx(path: Path, a: np.ndarray) -> None:
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.float32): 0x0D}[a.dtype]
    big = a.astype(a.dtype.newbyteorder(">"))
    path.write_bytes(
        bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + big.tobytes()
    )


def write_client_file(out: Path, num_clients: int, cid: int, fmt: str) -> Path:
    """Client `cid`'s share as a local data file: npz, csv or idx (a directory)."""
    x, y = arrays(num_clients)[0][cid]
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "npz":
        path = out / f"client-{cid}.npz"
        np.savez(path, x=x, y=y)
    elif fmt == "csv":
        path = out / f"client-{cid}.csv"
        header = ",".join([f"f{i}" for i in range(FEATURES)] + ["label"])
        rows = [
            ",".join([*(repr(float(v)) for v in xi), str(int(yi))])
            for xi, yi in zip(x, y, strict=True)
        ]
        path.write_text(header + "\n" + "\n".join(rows) + "\n")
    elif fmt == "idx":
        path = out / f"client-{cid}-idx"
        path.mkdir(exist_ok=True)
        write_idx(path / "train-images-idx3-ubyte", x)
        write_idx(path / "train-labels-idx1-ubyte", y.astype(np.uint8))
    else:
        raise ValueError(fmt)
    return path


def write_big_file(path: Path, n: int) -> Path:
    """A device with `n` examples of the same blobs (slow to train on, for dropout tests)."""
    rng = np.random.default_rng(99)
    centers = np.random.default_rng(4321).normal(scale=2.0, size=(CLASSES, FEATURES))
    x, y = _blobs(n, rng, centers)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=y)
    return path
