"""Evaluation of a flat model vector on a labelled set (server test set or client holdout)."""

from __future__ import annotations

import math

import torch

from fedveil.flat_model import FlatModel
from fedveil.task_types import LossFn


def evaluate(
    model: FlatModel,
    vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    batch_size: int = 256,
) -> tuple[float, float, int]:
    """(mean loss, accuracy, examples) of the model `vector` on (x, y)."""
    losses, correct = evaluate_batches(model, vector, x, y, loss_fn, batch_size)
    return summarize(losses, correct, int(x.shape[0]))


def summarize(losses: list[float], correct: int, n: int) -> tuple[float, float, int]:
    """(mean loss, accuracy, n) from per-batch loss sums: exactly rounded (math.fsum), so the
    result does not depend on which process evaluated which batches."""
    if n == 0:
        return float("nan"), float("nan"), 0
    return math.fsum(losses) / n, correct / n, n


@torch.no_grad()
def evaluate_batches(
    model: FlatModel,
    vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    batch_size: int,
) -> tuple[list[float], int]:
    """Each batch's summed loss, in order, and the number of correct predictions."""
    model.set(vector)
    module = model.module
    module.eval()
    losses: list[float] = []
    correct = 0
    for start in range(0, int(x.shape[0]), batch_size):
        xb = x[start : start + batch_size].to(model.device, non_blocking=True)
        yb = y[start : start + batch_size].to(model.device, non_blocking=True)
        logits = module(xb)
        losses.append(float(loss_fn(logits, yb)) * int(yb.shape[0]))
        correct += int((logits.argmax(dim=1) == yb).sum())
    return losses, correct
