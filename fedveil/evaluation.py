"""Evaluation of a flat model vector on a labelled set (server test set or client holdout)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .params import FlatModel

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def evaluate(
    model: FlatModel,
    vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    batch_size: int = 1024,
) -> tuple[float, float, int]:
    """(mean loss, accuracy, examples) of the model `vector` on (x, y)."""
    model.set(vector)
    module = model.module
    module.eval()
    n = int(x.shape[0])
    if n == 0:
        return float("nan"), float("nan"), 0
    loss_sum = 0.0
    correct = 0
    for start in range(0, n, batch_size):
        xb = x[start : start + batch_size].to(model.device, non_blocking=True)
        yb = y[start : start + batch_size].to(model.device, non_blocking=True)
        logits = module(xb)
        loss_sum += float(loss_fn(logits, yb)) * int(yb.shape[0])
        correct += int((logits.argmax(dim=1) == yb).sum())
    return loss_sum / n, correct / n, n
