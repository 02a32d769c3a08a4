"""Built-in models, registered by name.

Each factory takes the input shape (without batch) and the number of classes,
so one name works for Fashion-MNIST images, digits and tabular data alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

ModelFactory = Callable[[tuple[int, ...], int], nn.Module]

MODELS: dict[str, ModelFactory] = {}


def register_model(name: str) -> Callable[[ModelFactory], ModelFactory]:
    def wrap(factory: ModelFactory) -> ModelFactory:
        MODELS[name] = factory
        return factory

    return wrap


@register_model("logreg")
def logistic_regression(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


@register_model("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> nn.Module:
    # 784-128-10 is ~100k parameters: the reference workload of the simulation benchmark.
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


class SmallCNN(nn.Module):
    """Two 5x5 conv blocks (16, 32 channels by default) and one hidden dense layer.

    About 80k parameters at 28x28 (`cnn`). `cnn-wide` (32, 64 channels, 160 hidden
    units: about 218k parameters) costs four times the multiply-adds and learns
    Fashion-MNIST's harder classes better under label skew.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        channels_out: tuple[int, int] = (16, 32),
        hidden: int = 128,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"model 'cnn' needs image input (C, H, W); got shape {input_shape}")
        channels, height, width = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(channels, channels_out[0], kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels_out[0], channels_out[1], kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.features(torch.zeros(1, channels, height, width)).shape[1]
        self.head = nn.Sequential(
            nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _check_image(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) == 3 and min(input_shape[1:]) < 16:
        raise ValueError(
            f"model {name!r} needs images of at least 16x16 pixels; got {input_shape}; "
            "use 'mlp' or 'logreg' for small inputs"
        )


@register_model("cnn")
def small_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _check_image("cnn", input_shape)
    return SmallCNN(input_shape, num_classes)


@register_model("cnn-wide")
def wide_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    _check_image("cnn-wide", input_shape)
    return SmallCNN(input_shape, num_classes, channels_out=(32, 64), hidden=160)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(
            f"model = {name!r}: unknown; choose one of {sorted(MODELS)} "
            "or give a task as 'module:function'"
        ) from None
    return factory(input_shape, num_classes)
