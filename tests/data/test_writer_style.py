"""Per-writer style transform: deterministic, distinct per writer, shape/range preserving."""

import numpy as np
import pytest
import torch

from fedveil.data.writer_style import apply_writer_style, writer_style


def _strokes(n: int = 16, size: int = 28, offset: float = -0.4) -> torch.Tensor:
    """Thin bars on a flat background (like normalised MNIST: background < 0)."""
    g = torch.Generator().manual_seed(0)
    x = torch.full((n, 1, size, size), offset)
    for i in range(n):
        r = int(torch.randint(6, size - 6, (1,), generator=g))
        x[i, 0, r : r + 2, 4 : size - 4] = 2.0
        x[i, 0, 4 : size - 4, r : r + 2] = 1.5
    return x


def test_deterministic_and_distinct_per_writer_and_seed():
    x = _strokes()
    a = apply_writer_style(x, 3, seed=0)
    assert torch.equal(a, apply_writer_style(x, 3, seed=0))
    assert not torch.allclose(a, apply_writer_style(x, 4, seed=0))
    assert not torch.allclose(a, apply_writer_style(x, 3, seed=1))
    assert writer_style(3, 0) == writer_style(3, 0) != writer_style(3, 1)


def test_preserves_shape_dtype_and_value_range():
    x = _strokes()
    for cid in range(8):
        y = apply_writer_style(x, cid, seed=5)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert y.min() >= x.min() - 1e-6 and y.max() <= x.max() + 1e-6
        assert not torch.equal(y, x)
    y64 = apply_writer_style(x.double(), 0, seed=5)
    assert y64.dtype == torch.float64


def test_batchwise_equals_per_image_and_single_image_form():
    x = _strokes(6)
    batch = apply_writer_style(x, 2, seed=0)
    singles = torch.stack([apply_writer_style(img, 2, seed=0) for img in x])
    torch.testing.assert_close(batch, singles)


def test_background_stays_background():
    x = _strokes(4)
    y = apply_writer_style(x, 1, seed=0)
    assert torch.allclose(y[:, :, 0, :], torch.full_like(y[:, :, 0, :], -0.4))  # top row blank
    explicit = apply_writer_style(x, 1, seed=0, background=-0.4)
    torch.testing.assert_close(explicit, y)


def test_thickness_changes_ink_mass():
    # Writers with positive thickness draw bolder strokes than writers with negative thickness.
    x = _strokes(32)
    ink = x - x.min()
    bold = [c for c in range(40) if writer_style(c, 0).thickness > 0.7][:3]
    thin = [c for c in range(40) if writer_style(c, 0).thickness < -0.7][:3]
    assert bold and thin

    def mass(c: int) -> float:
        return float((apply_writer_style(x, c, 0) - x.min()).sum() / ink.sum())

    assert min(mass(c) for c in bold) > max(mass(c) for c in thin)


def test_style_parameters_are_in_documented_ranges():
    for cid in range(200):
        s = writer_style(cid, 11)
        assert abs(s.slant) <= 0.35 and abs(np.degrees(s.rotation)) <= 8
        assert 0.75 < s.scale_x < 1.2 and 0.75 < s.scale_y < 1.2
        assert -1 <= s.thickness <= 1 and 0.7 <= s.contrast <= 1


def test_rejects_non_image_input():
    with pytest.raises(ValueError, match="N x C x H x W"):
        apply_writer_style(torch.zeros(10, 60), 0, 0)
    with pytest.raises(ValueError, match="float tensor"):
        apply_writer_style(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), 0, 0)
    with pytest.raises(ValueError, match="client_id=-1"):
        apply_writer_style(torch.zeros(2, 1, 8, 8), -1, 0)
    assert apply_writer_style(torch.zeros(0, 1, 8, 8), 0, 0).shape == (0, 1, 8, 8)
