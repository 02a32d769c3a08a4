"""The silo's fused encode and decode (Quantizer.draw_rounding, quantize_masked_into,
decode_weighted_mean_into) against the one-shot path: the same integers and the same
decoded mean bit for bit, unbiased rounding from the CSPRNG, NaN refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedveil.privacy.secagg import Quantizer

# (levels, clients, max_weight, unsigned out): uint32 wires with and without the final AND,
# a uint32 quantiser on a 64-bit wire, and a uint64 quantiser
CONFIGS = [
    (2**16, 4, 1, np.uint32),
    (2**14, 4, 5, np.uint32),
    (2**31, 2, 1, np.uint32),
    (2**28, 8, 1, np.uint64),
    (2**40, 4, 1, np.uint64),
]


def _update(size: int) -> np.ndarray:
    x = np.random.default_rng(7).normal(0.0, 0.6, size).astype(np.float32)
    x[[3, 4]] = np.inf, -np.inf  # clip to ±r as quantize does
    return x


@pytest.mark.parametrize(("levels", "clients", "max_weight", "unsigned"), CONFIGS)
def test_masked_sweep_equals_quantize_then_mask_bit_for_bit(levels, clients, max_weight, unsigned):
    q = Quantizer(1.0, levels, clients, max_weight)
    size, seed, scale = 50_003, bytes(range(32)), 3 / max_weight if max_weight > 3 else 1.0
    x = _update(size)
    masks = np.random.default_rng(1).integers(0, 2**q.bits, size, dtype=np.uint64).astype(q.dtype)
    expected = (q.quantize(x, seed, scale=scale).astype(np.uint64) + masks) % (1 << q.bits)

    out = np.empty(size, unsigned)
    q.quantize_masked_into(x, q.draw_rounding(size, seed), masks, out, scale=scale)

    assert np.array_equal(out.astype(np.uint64), expected)


@pytest.mark.parametrize(("levels", "clients", "max_weight", "unsigned"), CONFIGS)
def test_decode_into_is_decode_weighted_mean_bit_for_bit(levels, clients, max_weight, unsigned):
    del unsigned
    q = Quantizer(1.0, levels, clients, max_weight)
    body = np.random.default_rng(2).integers(0, clients * (levels - 1), 70_001, dtype=np.uint64)
    total = np.concatenate([body, [clients * max_weight - 1, clients]]).astype(q.dtype)
    mean, weight_sum, count = q.decode_weighted_mean(total)
    for dtype in (np.float64, np.float32):
        out = np.empty(body.size, dtype)
        assert q.decode_weighted_mean_into(total, out) == (weight_sum, count)
        assert np.array_equal(out, mean.astype(dtype))


def test_drawn_rounding_is_fresh_unbiased_and_within_one_step():
    q = Quantizer(1.0, 2**4, 4, 1)
    value = np.float32(0.3)  # 0.3 / step + 7.5 = 9.75 steps: rounds up 3 times in 4
    x = np.full(200_000, value, np.float32)
    first, second = q.draw_rounding(x.size), q.draw_rounding(x.size)
    assert not np.array_equal(first, second)  # a fresh key per draw
    decoded = []
    for offsets in (first, second):
        out = np.empty(x.size, np.uint32)
        q.quantize_masked_into(x, offsets, np.zeros(x.size, np.uint32), out)
        assert set(np.unique(out)) == {9, 10}
        decoded.append(out * q.step - q.clip_range)
    mean = float(np.mean(decoded))
    # unbiased: the mean of 400,000 roundings within 5 standard errors of the value
    assert abs(mean - float(value)) < 5 * q.step * np.sqrt(0.75 * 0.25 / 400_000)


def test_nan_and_mismatched_shapes_are_refused_by_name():
    q = Quantizer(1.0, 2**8, 4, 1)
    x = np.zeros(40_000, np.float32)
    x[33_000] = np.nan
    offsets, masks, out = (
        q.draw_rounding(x.size),
        np.zeros(x.size, np.uint32),
        np.empty(x.size, np.uint32),
    )
    with pytest.raises(ValueError, match=r"values: NaN among coordinates") as caught:
        q.quantize_masked_into(x, offsets, masks, out)
    first, last = map(int, str(caught.value).rsplit(" ", 1)[1].split(".."))
    assert first <= 33_000 <= last  # the chunk that holds it
    with pytest.raises(ValueError, match=r"offsets: shape \(39999,\), the values have \(40000,\)"):
        q.quantize_masked_into(x, offsets[1:], masks, out)
    with pytest.raises(ValueError, match="out: dtype int32"):
        q.quantize_masked_into(x, offsets, masks, out.view(np.int32))
    with pytest.raises(ValueError, match=r"out: shape \(2,\), the sum.s body has \(3,\)"):
        q.decode_weighted_mean_into(np.array([1, 2, 3, 1, 1], np.uint32), np.empty(2))
