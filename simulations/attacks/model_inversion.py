"""Model inversion of a run's final model (Fredrikson et al. 2015): for each class, the
input the model is most confident belongs to it, found by gradient ascent on the class's
log-probability under a smoothness prior (total variation, for images) and an L2 prior,
projected after every step into the range the training data spans.

What it recovers is a class's representative input, not any one person's example: it shows
what the released model reveals about each class as a whole, which DP does not hide.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedveil.builtin_models import build_model
from fedveil.config import load_config
from fedveil.data.pixels import FASHION_MNIST_MEAN, FASHION_MNIST_STD
from fedveil.flat_model import FlatModel
from fedveil.server.engine.lifecycle import MODEL_FILE
from fedveil.simulations.attacks.membership import one_thread
from fedveil.tasks import make_task

CONFIG_FILE = "config.toml"
IMAGE_FILE = "model_inversion.png"
REPORT_FILE = "model_inversion.json"


@dataclass
class InversionSettings:
    steps: int = 400
    lr: float = 0.05  # a share of the data range per Adam step
    tv: float = 0.05  # total-variation weight (images only)
    l2: float = 0.005


@dataclass
class RunModel:
    """A run's final model, rebuilt from model.safetensors and its metadata."""

    model: nn.Module
    input_shape: tuple[int, ...]
    num_classes: int
    metadata: dict[str, str]


def load_run_model(run_dir: Path) -> RunModel:
    """The model in RUN_DIR/model.safetensors; a missing file is named."""
    from safetensors import safe_open

    path = Path(run_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; the attack needs the run's final model ({MODEL_FILE}, "
            "written when a run finishes)"
        )
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    for key in ("input_shape", "num_classes"):
        if key not in meta:
            raise ValueError(f"{path}: metadata lacks {key!r}; cannot rebuild the model")
    shape = tuple(int(v) for v in json.loads(meta["input_shape"]))
    classes = int(meta["num_classes"])
    if "model" in meta:
        model = build_model(meta["model"], shape, classes)
    elif "task_ref" in meta:  # a custom task's model comes from its task function
        model = make_task(load_config(_config_path(run_dir))).model_fn()
    else:
        raise ValueError(f"{path}: metadata names neither 'model' nor 'task_ref'")
    flat = FlatModel(model)
    flat.set(flat.load(str(path)))
    return RunModel(model.eval(), shape, classes, meta)


def _config_path(run_dir: Path) -> Path:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; the attack reads the run's {CONFIG_FILE} (to rebuild a "
            "custom task's model, or find the data range: else pass --range LO,HI)"
        )
    return path


def data_range(run_dir: Path, meta: dict[str, str]) -> tuple[float, float]:
    """The range of the training inputs the model saw (projection bounds)."""
    if meta.get("dataset") == "fashion-mnist":  # standardised pixels in [0, 1]
        return (
            -FASHION_MNIST_MEAN / FASHION_MNIST_STD,
            (1 - FASHION_MNIST_MEAN) / FASHION_MNIST_STD,
        )
    task = make_task(load_config(_config_path(run_dir)))
    if task.test_data is None:
        raise ValueError(f"{run_dir}: the task has no test data to take a range from; pass --range")
    x = task.test_data[0]
    return float(x.min()), float(x.max())


def total_variation(x: torch.Tensor) -> torch.Tensor:
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., 1:] - x[..., :-1]).abs().mean()


def class_confidence(model: nn.Module, x: torch.Tensor, cls: int) -> float:
    with torch.no_grad():
        return float(torch.softmax(model(x[None]), dim=1)[0, cls])


def invert_class(
    model: nn.Module,
    cls: int,
    input_shape: tuple[int, ...],
    lo: float,
    hi: float,
    settings: InversionSettings | None = None,
) -> tuple[torch.Tensor, float, float]:
    """A representative input of class `cls`; with the confidence at the start and end.

    The start is the middle of the data range (for standardised data, close to the mean
    input), so the image owes nothing to any one training example."""
    s = settings or InversionSettings()
    if not lo < hi:
        raise ValueError(f"range = ({lo}, {hi}): the lower bound must be below the upper")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    x = torch.full(input_shape, (lo + hi) / 2, requires_grad=True)
    start = class_confidence(model, x.detach(), cls)
    opt = torch.optim.Adam([x], lr=s.lr * (hi - lo))
    image = len(input_shape) == 3
    for _ in range(s.steps):
        opt.zero_grad(set_to_none=True)
        loss = -torch.log_softmax(model(x[None]), dim=1)[0, cls] + s.l2 * (x**2).mean()
        if image and s.tv > 0:
            loss = loss + s.tv * total_variation(x)
        loss.backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(lo, hi)
    x = x.detach()
    return x, start, class_confidence(model, x, cls)


def invert_run(
    run_dir: Path,
    out: Path,
    *,
    value_range: tuple[float, float] | None = None,
    settings: InversionSettings | None = None,
) -> dict[str, Any]:
    """One image per class from RUN_DIR's final model: out/model_inversion.png (a grid)
    and out/model_inversion.json (each class's confidence before and after)."""
    run = load_run_model(Path(run_dir))
    lo, hi = value_range or data_range(Path(run_dir), run.metadata)
    s = settings or InversionSettings()
    images, rows = [], []
    with one_thread():
        for cls in range(run.num_classes):
            x, start, end = invert_class(run.model, cls, run.input_shape, lo, hi, s)
            images.append(x)
            rows.append({"class": cls, "start_confidence": start, "final_confidence": end})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_png(out / IMAGE_FILE, image_grid(images, lo, hi))
    report = {
        "run_dir": str(run_dir),
        "range": [lo, hi],
        "settings": asdict(s),
        "classes": rows,
        "image": IMAGE_FILE,
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return report


# -- the PNG grid (no imaging library needed) ----------------------------------------------
def _as_pixels(x: torch.Tensor, lo: float, hi: float) -> np.ndarray:
    """H x W (grey) or H x W x 3 (RGB) uint8."""
    a = ((x.numpy() - lo) / (hi - lo)).clip(0, 1)
    if a.ndim == 3:
        a = a[0] if a.shape[0] != 3 else a.transpose(1, 2, 0)
    elif a.ndim == 1:
        side = math.isqrt(a.size)
        a = a.reshape(side, side) if side * side == a.size else a.reshape(1, -1)
    return (a * 255).round().astype(np.uint8)


def image_grid(
    images: list[torch.Tensor], lo: float, hi: float, *, min_side: int = 56
) -> np.ndarray:
    """One row of tiles, each scaled up by a whole factor to at least `min_side` pixels."""
    tiles = [_as_pixels(x, lo, hi) for x in images]
    scale = max(1, math.ceil(min_side / max(tiles[0].shape[:2])))
    tiles = [t.repeat(scale, axis=0).repeat(scale, axis=1) for t in tiles]
    h = tiles[0].shape[0]
    gap = np.full((h, 2, *tiles[0].shape[2:]), 255, dtype=np.uint8)
    row: list[np.ndarray] = []
    for t in tiles:
        row += [t, gap]
    return np.concatenate(row[:-1], axis=1)


def write_png(path: Path, pixels: np.ndarray) -> Path:
    """8-bit greyscale (H x W) or RGB (H x W x 3) PNG."""
    height, width = pixels.shape[:2]
    colour = 2 if pixels.ndim == 3 else 0
    raw = b"".join(b"\x00" + pixels[r].tobytes() for r in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    return path
