"""The built-in CNNs: `cnn` unchanged (80,202 parameters at 28x28), `cnn-wide` its wider
sibling (32/64 channels, 160 hidden units: 217,706), both refusing images too small."""

from __future__ import annotations

import pytest
import torch

from fedveil.builtin_models import build_model


@pytest.mark.parametrize(("name", "params"), [("cnn", 80_202), ("cnn-wide", 217_706)])
def test_cnn_sizes_and_a_forward_pass(name: str, params: int) -> None:
    model = build_model(name, (1, 28, 28), 10)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model(torch.zeros(4, 1, 28, 28)).shape == (4, 10)


def test_cnn_wide_refuses_small_images_by_name() -> None:
    with pytest.raises(ValueError, match="model 'cnn-wide' needs images of at least 16x16"):
        build_model("cnn-wide", (1, 8, 8), 10)
