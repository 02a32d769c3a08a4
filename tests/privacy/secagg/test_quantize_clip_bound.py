"""Central DP under secure aggregation: what the quantizer sends never exceeds the clip C.

The accountant assumes each client's decoded update has L2 norm <= C. Stochastic rounding
onto the grid adds up to one step per coordinate, so an update clipped to C on the client can
decode above C. `encode_weighted(..., l2_bound=C)` must make that impossible, for any input
an adversarial (or careless) caller can choose.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedveil.client.secagg_stages import encode_update
from fedveil.privacy.secagg import Quantizer
from fedveil.privacy.secagg.quantize import rounding_room
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.fields import ENC

# Float error of dequantizing (q · step - r) on the server, relative.
TOLERANCE = 1e-6
EXTRAS = np.array([0.5, 1.0])  # loss and unclipped indicator: not part of the bound


def decoded_update(q: Quantizer, encoded: np.ndarray, dim: int) -> np.ndarray:
    """What the server decodes for a single client: its update, weight divided out."""
    mean, _, count = q.decode_weighted_mean(encoded.astype(np.uint64))
    assert count == 1
    return mean[:dim]


def feasible(q: Quantizer, bound: float, dim: int) -> bool:
    return rounding_room(bound / q.step, dim) is not None


def adversarial_vector(
    kind: str, q: Quantizer, bound: float, dim: int, heavy: int, rng: np.random.Generator
) -> tuple[np.ndarray, float]:
    """(update, bound) for one adversarial shape; some shapes set the bound themselves."""
    if kind == "norm_exactly_c":
        x = rng.normal(size=dim)
        return x * (bound / np.linalg.norm(x)), bound
    if kind == "few_coordinates":  # all mass on `heavy` coordinates
        x = np.zeros(dim)
        picks = rng.choice(dim, size=min(heavy, dim), replace=False)
        x[picks] = rng.choice([-1.0, 1.0], size=picks.size) * bound / math.sqrt(picks.size)
        return x, bound
    if kind == "grid_midpoints":  # every coordinate halfway between two grid points
        k = rng.integers(0, q.levels - 1, size=dim)
        x = -q.clip_range + (k + 0.5) * q.step
        return x, float(np.linalg.norm(x))  # C = their norm: rounding adds variance
    if kind == "unclipped":  # a caller that never clipped: 100 x C
        x = rng.normal(size=dim)
        return x * (100 * bound / np.linalg.norm(x)), bound
    raise AssertionError(kind)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["norm_exactly_c", "few_coordinates", "grid_midpoints", "unclipped"]),
    levels=st.sampled_from([2, 3, 4, 5, 16, 17, 255, 256, 2**16, 2**20]),
    clip_range=st.floats(0.01, 10.0),
    # C in grid steps, from far below one step to far above it
    steps=st.floats(1e-3, 1e7),
    dim=st.sampled_from([1, 2, 3, 10, 257, 4096, 20_000]),
    heavy=st.integers(1, 3),
    max_weight=st.sampled_from([1, 1, 7]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_decoded_update_never_exceeds_the_bound(
    kind: str,
    levels: int,
    clip_range: float,
    steps: float,
    dim: int,
    heavy: int,
    max_weight: int,
    dtype: type[np.floating],
    seed: int,
) -> None:
    q = Quantizer(clip_range, levels, max_clients=1, max_weight=max_weight)
    rng = np.random.default_rng(seed)
    x, bound = adversarial_vector(kind, q, steps * q.step, dim, heavy, rng)
    assume(bound > 0)  # midpoints of a 2-level grid are all 0
    x = x.astype(dtype)
    weight = int(rng.integers(1, max_weight + 1))
    if not feasible(q, bound * weight / max_weight, dim):
        with pytest.raises(ValueError, match=r"secagg\.levels.*secagg\.clip_range.*dp\.clip"):
            q.encode_weighted([x, EXTRAS], weight, l2_bound=bound)
        return
    encoded = q.encode_weighted([x, EXTRAS], weight, l2_bound=bound)
    norm = float(np.linalg.norm(decoded_update(q, encoded, dim)))
    assert norm <= bound * (1 + TOLERANCE), (norm, bound)


def test_a_large_update_clipped_to_c_stays_under_c() -> None:
    """Flower's grid (2^20 levels over [-1, 1]) and a 300k-parameter model at exactly C."""
    q = Quantizer(1.0, 2**20, max_clients=100)
    rng = np.random.default_rng(7)
    for clip in (0.05, 1.0, 10.0):
        x = rng.normal(size=300_000)
        x = (x * (clip / np.linalg.norm(x))).astype(np.float32)
        for _ in range(5):
            encoded = q.encode_weighted([x, EXTRAS], 1, l2_bound=clip)
            assert np.linalg.norm(decoded_update(q, encoded, x.size)) <= clip * (1 + 1e-9)


def on_grid_at_c(dim: int, clip: float) -> np.ndarray:
    """All mass on one coordinate, exactly C and on the grid (C = r): it is sent as is, and
    every other coordinate (0, a grid midpoint when L is even) rounds to ±step/2. The
    plain rounded norm is sqrt(C^2 + (d - 1) step^2 / 4) > C, every time."""
    x = np.zeros(dim, np.float32)
    x[0] = clip
    return x


def test_without_the_bound_rounding_exceeds_the_clip() -> None:
    """The flaw, deterministically: an update of norm exactly C decodes above C after plain
    stochastic rounding. With the bound it does not, and the pre-clip costs only a few grid
    steps of norm, not the worst case sqrt(d) steps."""
    clip = 1.0
    q = Quantizer(clip, 2**16, max_clients=10)
    x = on_grid_at_c(100_000, clip)
    plain = np.linalg.norm(decoded_update(q, q.encode_weighted([x, EXTRAS], 1), x.size))
    assert plain == pytest.approx(math.sqrt(clip**2 + (x.size - 1) * q.step**2 / 4), rel=1e-9)
    assert plain > clip * (1 + 1e-6)
    bounded = decoded_update(q, q.encode_weighted([x, EXTRAS], 1, l2_bound=clip), x.size)
    assert clip - 10 * q.step < np.linalg.norm(bounded) <= clip
    # A random direction clipped as the client runtime clips (a hair under C) exceeds C in
    # about 3 of 4 plain encodes; bounded, never.
    y = np.random.default_rng(3).normal(size=100_000)
    y = (y * (clip * (1 - 2**-20) / np.linalg.norm(y))).astype(np.float32)
    norms = [
        np.linalg.norm(decoded_update(q, q.encode_weighted([y, EXTRAS], 1), y.size))
        for _ in range(20)
    ]
    assert max(norms) > clip * (1 + 1e-6)  # fails with probability ~1e-12
    for _ in range(20):
        encoded = q.encode_weighted([y, EXTRAS], 1, l2_bound=clip)
        assert np.linalg.norm(decoded_update(q, encoded, y.size)) <= clip
    # The extra coordinates are outside the bound: not shrunk, within a step of their values.
    extras = q.decode_weighted_mean(encoded.astype(np.uint64))[0][y.size :]
    assert np.all(np.abs(extras - EXTRAS) < q.step)


def test_a_grid_too_coarse_for_the_clip_is_refused() -> None:
    q = Quantizer(1.0, 16, max_clients=10)  # step 0.133: rounding alone adds ~0.067/coord
    with pytest.raises(ValueError, match=r"secagg\.levels.*secagg\.clip_range.*dp\.clip"):
        q.encode_weighted([np.zeros(1000, np.float32), EXTRAS], 1, l2_bound=0.5)


def test_the_client_bounds_its_update_by_the_requests_clip_norm() -> None:
    """The masked-input stage: under central DP the request carries clip_norm, and the
    encoded update decodes within it; without DP nothing changes."""
    q = Quantizer(1.0, 2**16, max_clients=10)
    config = {
        ENC + "kind": "quantized",
        ENC + "clip_range": q.clip_range,
        ENC + "levels": q.levels,
        ENC + "max_clients": q.max_clients,
        ENC + "max_weight": q.max_weight,
    }
    delta = torch.from_numpy(on_grid_at_c(100_000, 1.0))  # norm exactly C = 1
    reply = {"loss": 0.3, "weight": 1.0, "unclipped": 0}
    dp = Envelope("secagg.masked_input", 1, {**config, "clip_norm": 1.0})
    encoded = encode_update(dp, reply, delta)
    assert np.linalg.norm(decoded_update(q, encoded, delta.numel())) <= 1.0
    plain = encode_update(Envelope("secagg.masked_input", 1, config), reply, delta)
    assert np.linalg.norm(decoded_update(q, plain, delta.numel())) > 1.0 + 1e-6
