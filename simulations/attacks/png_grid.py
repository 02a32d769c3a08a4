"""A PNG grid: true images (top row) above their matched reconstructions (bottom)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

_ZOOM = 3
_GAP = 2


def write_grid(path: Path, truth: np.ndarray, recon: np.ndarray, columns: int = 16) -> Path:
    """`truth` and `recon`: N x H x W in [0, 1], pairs in the same order; at most
    `columns` pairs are drawn."""
    n = min(len(truth), len(recon), columns)
    if n == 0:
        raise ValueError("no image pairs to draw; allowed: at least one")
    h, w = truth.shape[1:]
    canvas = np.ones((2 * h + 3 * _GAP, n * (w + _GAP) + _GAP))
    for c in range(n):
        x0 = _GAP + c * (w + _GAP)
        canvas[_GAP : _GAP + h, x0 : x0 + w] = truth[c]
        canvas[2 * _GAP + h : 2 * _GAP + 2 * h, x0 : x0 + w] = recon[c]
    img = Image.fromarray((np.clip(canvas, 0, 1) * 255).astype(np.uint8), mode="L")
    img = img.resize((img.width * _ZOOM, img.height * _ZOOM), Image.NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path
