"""Pixel standardisation shared by the built-in datasets and a device's own image files.

One formula, computed one way, so an image read on a device becomes the very
same float32 tensor the simulation trains on.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["FASHION_MNIST_MEAN", "FASHION_MNIST_STD", "standardize_pixels"]

# Training-set pixel statistics (of x/255), the usual Fashion-MNIST normalisation.
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


def standardize_pixels(images: np.ndarray, scale: float, mean: float, std: float) -> torch.Tensor:
    """``(images / scale - mean) / std`` as float32, same shape as ``images``."""
    x = torch.from_numpy(images).to(torch.float32)
    return x.mul_(1.0 / (scale * std)).sub_(mean / std)
