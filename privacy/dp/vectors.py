"""Conversion of model updates to flat float vectors (numpy or torch in, numpy out)."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_vector(update: Any, dtype: type = np.float32) -> np.ndarray:
    """Flatten a numpy array, torch tensor or sequence into a 1-D numpy vector.

    Torch is accepted without importing it: anything with `.detach()` is moved to
    the CPU first, so `privacy.dp` stays importable on machines without torch.
    """
    if hasattr(update, "detach"):
        update = update.detach().cpu().numpy()
    vector = np.asarray(update, dtype=dtype).reshape(-1)
    if not np.all(np.isfinite(vector)):
        raise ValueError("update contains NaN or infinite values; refusing to clip or encode it")
    return vector
