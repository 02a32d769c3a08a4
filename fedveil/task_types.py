"""The task contract: what a task function returns (`Task`) and one client's data
(`ClientData`).

Defined apart from tasks.py (which builds and loads tasks) so that the contract's
checker, taskcheck.py, and the loader both import it and neither imports the other.
Users import both names from `fedveil.tasks`, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class ClientData:
    """One client's local examples (and an optional local evaluation split)."""

    x: torch.Tensor
    y: torch.Tensor
    x_eval: torch.Tensor | None = None
    y_eval: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass
class Task:
    """Everything the round engine needs to know about what is being learned."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    num_clients: int
    model_fn: Callable[[], nn.Module]
    client_data: Callable[[int], ClientData]
    test_data: tuple[torch.Tensor, torch.Tensor] | None = None
    loss_fn: LossFn = functional.cross_entropy
    # Sizes of every client's training set, when known without loading it
    # (used for reports and for weighting; None for user tasks that do not say).
    client_sizes: np.ndarray | None = None
    info: dict[str, object] = field(default_factory=dict)
