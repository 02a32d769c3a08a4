"""Quantizer: modulus width, rounding error bound, unbiasedness, weight packing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedveil.privacy.secagg import Quantizer, pack, unpack


def test_bits_leave_room_for_the_whole_cohort() -> None:
    q = Quantizer(clip_range=1.0, levels=2**16, max_clients=1000)
    assert q.bits == (1000 * (2**16 - 1)).bit_length() == 26
    assert q.dtype is np.uint32
    wide = Quantizer(clip_range=1.0, levels=2**24, max_clients=10**6, max_weight=2**20)
    assert wide.bits > 32 and wide.dtype is np.uint64
    assert Quantizer(1.0, 2**16, 10, max_weight=2**30).bits == (10 * 2**30).bit_length()


def test_configs_that_cannot_fit_62_bits_are_rejected() -> None:
    with pytest.raises(ValueError, match="needs 64 bits > 62"):
        Quantizer(clip_range=1.0, levels=2**40, max_clients=2**24)
    with pytest.raises(ValueError):
        Quantizer(clip_range=0.0, levels=16, max_clients=4)
    with pytest.raises(ValueError):
        Quantizer(clip_range=1.0, levels=1, max_clients=4)


@settings(max_examples=40, deadline=None)
@given(
    clients=st.integers(1, 50),
    dim=st.integers(1, 64),
    levels=st.sampled_from([2, 3, 17, 256, 2**16, 2**20]),
    clip=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantized_sum_is_within_the_bound(
    clients: int, dim: int, levels: int, clip: float, seed: int
) -> None:
    q = Quantizer(clip_range=clip, levels=levels, max_clients=clients)
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-2 * clip, 2 * clip, size=(clients, dim))
    total = np.zeros(dim, dtype=np.uint64)
    for x in xs:
        encoded = q.quantize(x)
        assert encoded.dtype == q.dtype and int(encoded.max()) <= levels - 1
        total += encoded
    assert int(total.max()) < 2**q.bits
    exact = np.clip(xs, -clip, clip).sum(axis=0)
    assert np.all(
        np.abs(q.dequantize_sum(total, clients) - exact) <= q.sum_error_bound(clients) + 1e-9
    )


def test_stochastic_rounding_is_unbiased() -> None:
    q = Quantizer(clip_range=1.0, levels=3, max_clients=1)  # steps at -1, 0, 1
    x = np.full(200_000, 0.3)
    mean = q.dequantize_sum(q.quantize(x).astype(np.float64), 1).mean()
    assert abs(mean - 0.3) < 0.01


def test_weighted_mean_travels_in_extra_coordinates() -> None:
    q = Quantizer(clip_range=2.0, levels=2**20, max_clients=3, max_weight=1000)
    xs = [np.array([1.0, -1.0, 0.5]), np.array([0.0, 1.0, 0.5]), np.array([-1.0, 0.0, 1.5])]
    weights = [100, 300, 600]
    total = sum(q.encode_weighted(x, w).astype(np.uint64) for x, w in zip(xs, weights, strict=True))
    mean, weight_sum, count = q.decode_weighted_mean(total)
    expected = sum(w * x for x, w in zip(xs, weights, strict=True)) / sum(weights)
    assert weight_sum == 1000 and count == 3
    assert np.allclose(mean, expected, atol=1e-4)
    with pytest.raises(ValueError):
        q.encode_weighted(xs[0], 1001)


def test_pack_and_unpack() -> None:
    body = np.arange(5, dtype=np.uint32)
    packed = pack(body, [7, 1])
    assert packed.dtype == np.uint32 and packed.tolist() == [0, 1, 2, 3, 4, 7, 1]
    rest, extras = unpack(packed, 2)
    assert rest.tolist() == body.tolist() and extras == [7, 1]
    with pytest.raises(ValueError):
        pack(body, [2**32])
    with pytest.raises(ValueError):
        unpack(body, 6)


def test_nan_is_refused_naming_where_and_infinities_clip() -> None:
    q = Quantizer(clip_range=1.0, levels=2**10, max_clients=4)
    values = np.zeros(40_000)
    values[33_000] = np.nan
    with pytest.raises(ValueError, match=r"values: NaN among coordinates 32768\.\."):
        q.quantize(values)
    top = q.quantize(np.array([np.inf, -np.inf]))
    assert top.tolist() == [q.levels - 1, 0]


def test_parts_quantize_as_their_concatenation_in_any_float_dtype() -> None:
    q = Quantizer(clip_range=2.0, levels=2**22, max_clients=100, max_weight=8)
    rng = np.random.default_rng(3)
    x = rng.normal(size=50_001).astype(np.float32)
    tail = np.array([0.5, 1.5])
    seed = bytes(range(32))
    whole = q.encode_weighted(np.concatenate([x.astype(np.float64), tail]), 5, seed)
    assert np.array_equal(q.encode_weighted([x, tail], 5, seed), whole)
    # float32 input is widened before scaling, never rounded in float32.
    assert np.array_equal(q.quantize(x, seed), q.quantize(x.astype(np.float64), seed))
