"""FEMNIST-like "writer" clients built from a centrally collected image dataset.

In FEMNIST each client is one writer: it owns a natural amount of data
(quantity skew), a mildly skewed label mix, and — most importantly — its own
handwriting. ``writer_partition`` gives the first two; ``apply_writer_style`` gives
the third as a deterministic per-client transform (slant/shear, rotation, scale,
shift, stroke thickness, contrast).

How the round engine should use it::

    parts = partition(y_train, num_clients, "writer", seed)
    for cid, idx in enumerate(parts):
        x_c = apply_writer_style(ds.x_train[idx], cid, seed)  # once, when materialising
        y_c = ds.y_train[idx]

Apply the style once per client when its tensors are built (not per batch): it
is a fixed property of the writer, not augmentation. Pass the same ``seed`` as to
``partition``. Test data stays unstyled unless the engine builds per-client test
sets, in which case it should style them with the same ``client_id``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedveil.data.allocation import apportion, split_by_sizes

__all__ = ["WriterStyle", "apply_writer_style", "writer_partition", "writer_style"]

_STYLE_STREAM = 0x5717E  # keeps style draws independent of the partition's RNG stream


@dataclass(frozen=True)
class WriterStyle:
    slant: float  # horizontal shear, x += slant * y (italic handwriting)
    rotation: float  # radians
    scale_x: float
    scale_y: float
    shift_x: float  # fraction of the image width
    shift_y: float  # fraction of the image height
    thickness: float  # -1 (thinner, erosion) .. +1 (bolder, dilation), at 28x28
    contrast: float  # ink intensity multiplier, (0, 1]


def writer_style(client_id: int, seed: int) -> WriterStyle:
    """The style of writer ``client_id``; depends only on ``(client_id, seed)``."""
    if client_id < 0 or seed < 0:
        raise ValueError(f"client_id={client_id} and seed={seed} must be >= 0")
    rng = np.random.default_rng([int(seed), int(client_id), _STYLE_STREAM])
    size = rng.uniform(0.85, 1.10)
    aspect = rng.uniform(-0.06, 0.06)  # some writers write narrower, some wider
    return WriterStyle(
        slant=float(rng.uniform(-0.35, 0.35)),
        rotation=float(math.radians(rng.uniform(-8.0, 8.0))),
        scale_x=float(size * (1.0 + aspect)),
        scale_y=float(size * (1.0 - aspect)),
        shift_x=float(rng.uniform(-0.04, 0.04)),  # about +-1 pixel at 28x28
        shift_y=float(rng.uniform(-0.04, 0.04)),
        thickness=float(rng.uniform(-1.0, 1.0)),
        contrast=float(rng.uniform(0.7, 1.0)),
    )


def _inverse_affine(style: WriterStyle) -> torch.Tensor:
    # affine_grid wants the output->input map in normalised [-1, 1] coordinates,
    # so build the forward map (scale, then shear, then rotate, then shift) and invert it.
    c, s = math.cos(style.rotation), math.sin(style.rotation)
    rot = np.array([[c, -s], [s, c]])
    shear = np.array([[1.0, style.slant], [0.0, 1.0]])
    scale = np.diag([style.scale_x, style.scale_y])
    forward = rot @ shear @ scale
    shift = 2.0 * np.array([style.shift_x, style.shift_y])  # [-1, 1] spans the image
    inv = np.linalg.inv(forward)
    return torch.from_numpy(np.hstack([inv, (-inv @ shift)[:, None]]))


def _max3x3(x: torch.Tensor) -> torch.Tensor:
    """3x3 max filter, same as ``max_pool2d(x, 3, 1, 1)`` but separable and ~2x faster on CPU
    for one-channel images (max_pool2d with stride 1 is slow there)."""
    p = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
    rows = torch.maximum(p[..., :-2], p[..., 1:-1])
    rows = torch.maximum(rows, p[..., 2:], out=rows)
    out = torch.maximum(rows[..., :-2, :], rows[..., 1:-1, :])
    return torch.maximum(out, rows[..., 2:, :], out=out)


def apply_writer_style(
    x: torch.Tensor, client_id: int, seed: int, *, background: float | None = None
) -> torch.Tensor:
    """Render a batch of images in the handwriting of writer ``client_id``.

    ``x`` is ``N x C x H x W`` (or one ``C x H x W`` image), any float dtype or
    normalisation. Ink is measured above ``background`` — by default each image's
    minimum, which is the blank background for MNIST-like data whatever the
    normalisation. Output has the same shape, dtype and value range; deterministic
    for ``(client_id, seed)``; pure batched torch ops (a few ms per thousand images).
    """
    if not torch.is_floating_point(x):
        raise ValueError(f"apply_writer_style: x must be a float tensor, got {x.dtype}")
    single = x.ndim == 3
    batch = x.unsqueeze(0) if single else x
    if batch.ndim != 4:
        raise ValueError(
            f"apply_writer_style: x must be N x C x H x W images, got shape {tuple(x.shape)}"
        )
    if batch.shape[0] == 0:
        return x.clone()
    style = writer_style(client_id, seed)
    n, ch, h, w = batch.shape
    if background is None:
        bg = batch.amin(dim=(1, 2, 3), keepdim=True)
    else:
        bg = torch.full((n, 1, 1, 1), float(background), dtype=batch.dtype, device=batch.device)
    ink = (batch - bg).clamp_min(0)
    peak = ink.amax(dim=(1, 2, 3), keepdim=True)

    # One sampling grid serves the whole batch: every image of a writer gets the same warp.
    theta = _inverse_affine(style).to(batch).unsqueeze(0)
    grid = F.affine_grid(theta, [1, ch, h, w], align_corners=False).expand(n, -1, -1, -1)
    ink = F.grid_sample(ink, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    # Stroke width: blend towards a 3x3 dilation (max-pool) or erosion (min-pool).
    # One pixel is a bigger share of a small image, so weaken it below 28x28.
    t = style.thickness * min(1.0, min(h, w) / 28.0)
    if t > 0:
        ink = torch.lerp(ink, _max3x3(ink), t)
    elif t < 0:
        ink = torch.lerp(ink, -_max3x3(-ink), -t)

    out = (ink * style.contrast).clamp_(min=torch.zeros_like(peak), max=peak) + bg
    return out.squeeze(0) if single else out


def writer_partition(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    sigma: float = 0.4,
    label_alpha: float = 5.0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Quantity skew (LogNormal(0, sigma) sizes) plus mild label skew.

    Each writer prefers classes p_k ~ Dir(label_alpha * C * global distribution),
    so label_alpha is the per-class concentration for balanced data (large =
    closer to IID; FEMNIST-like defaults: sigma 0.4, label_alpha 5). Exact
    per-(client, class) counts come from iterative proportional fitting, so the
    partition still covers every sample exactly once. ``labels`` are 0..C-1.
    """
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma={sigma!r} must be finite and >= 0")
    if not (math.isfinite(label_alpha) and label_alpha > 0):
        raise ValueError(f"label_alpha={label_alpha!r} must be finite and > 0")
    n = len(labels)
    if min_size < 0 or min_size * num_clients > n:
        raise ValueError(
            f"min_size={min_size} must be >= 0 and min_size x num_clients <= {n} samples"
        )
    counts = np.bincount(labels)
    sizes = min_size + apportion(n - min_size * num_clients, rng.lognormal(0.0, sigma, num_clients))
    prefs = rng.dirichlet(label_alpha * len(counts) * counts / n, size=num_clients)

    # Sinkhorn/IPF: rows towards the writer sizes, columns to the class counts.
    target = sizes[:, None] * prefs + 1e-12
    for _ in range(200):
        target *= (counts / target.sum(axis=0))[None, :]
        row = target.sum(axis=1)
        if np.allclose(row, sizes, rtol=1e-6, atol=1e-3):
            break
        target *= (sizes / np.maximum(row, 1e-300))[:, None]
    alloc = np.stack([apportion(int(counts[c]), target[:, c]) for c in range(len(counts))], axis=1)

    # Rounding can leave a writer below min_size; move single samples from the largest.
    row = alloc.sum(axis=1)
    while row.min() < min_size:
        small, big = int(np.argmin(row)), int(np.argmax(row))
        cls = int(np.argmax(alloc[big]))
        alloc[big, cls] -= 1
        alloc[small, cls] += 1
        row[big] -= 1
        row[small] += 1

    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(len(counts)):
        members = rng.permutation(np.flatnonzero(labels == c))
        for k, chunk in enumerate(split_by_sizes(members, alloc[:, c])):
            parts[k].append(chunk)
    return [np.concatenate(p) for p in parts]
