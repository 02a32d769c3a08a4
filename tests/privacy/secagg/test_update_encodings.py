"""One class per update encoding: what a client encodes, the same class decodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.client.secagg_stages import encode_update
from fedveil.privacy.dp import SkellamParams
from fedveil.privacy.encodings import (
    EXTRAS,
    LOSS_CAP,
    QuantizedEncoding,
    SkellamEncoding,
)
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.requests import encoding_config


def request(config: dict) -> Envelope:
    return Envelope(Kind.SECAGG_MASKED_INPUT, 1, dict(config))


def summed(vectors: list[np.ndarray], bits: int) -> np.ndarray:
    total = np.zeros(vectors[0].shape, dtype=np.uint64)
    for v in vectors:
        total = (total + v.astype(np.uint64)) % np.uint64(1 << bits)
    return total


def test_quantized_client_encoding_decodes_on_the_server():
    rng = np.random.default_rng(0)
    d, cohort = 50, 3
    server = QuantizedEncoding(clip_range=0.5, levels=1 << 12, max_weight=100)
    msg = request(encoding_config(server.request_fields(cohort)))
    updates = [rng.uniform(-0.2, 0.2, d).astype(np.float32) for _ in range(cohort)]
    replies = [
        {F.LOSS: 1.5, F.WEIGHT: 10.0, F.UNCLIPPED: 1},
        {F.LOSS: 99.0, F.WEIGHT: 20.0, F.UNCLIPPED: 0},  # loss beyond the cap
        {F.LOSS: 0.5, F.WEIGHT: 30.0},  # no clipping indicator
    ]
    encoded = [
        QuantizedEncoding.from_request(msg).encode(u, r, l2_bound=None)
        for u, r in zip(updates, replies, strict=True)
    ]
    assert {e.size for e in encoded} == {server.dimension(d)} and EXTRAS == ("loss", "unclipped")
    out = server.decode(summed(encoded, server.bits(cohort)), cohort, d)
    weights = [10.0, 20.0, 30.0]
    expected = sum(w * u for w, u in zip(weights, updates, strict=True))
    step = 2 * 0.5 / ((1 << 12) - 1)
    assert out.weight == 60.0
    # Each client sends x·w/W rounded to the grid: up to one step of W per client.
    assert np.allclose(out.total.numpy(), expected, atol=cohort * 100 * step)
    mean_loss = (10 * 1.5 + 20 * LOSS_CAP + 30 * 0.5) / 60
    # The extras ride weighted too, in units of r: the same grid error, rescaled.
    mean_error = cohort * 100 * step / 60 / 0.5
    assert out.loss == pytest.approx(mean_loss, abs=mean_error * LOSS_CAP)
    assert out.extras["unclipped"] == pytest.approx(10.0, abs=mean_error * 60)


def test_the_client_path_is_the_encoding_class():
    server = QuantizedEncoding(clip_range=1.0, levels=1 << 8, max_weight=4)
    msg = request({**encoding_config(server.request_fields(2)), F.CLIP_NORM: 0.3})
    delta = np.full(20, 0.05, dtype=np.float32)
    reply = {F.LOSS: 2.0, F.WEIGHT: 3.0}
    a = encode_update(msg, reply, torch.from_numpy(delta))
    b = QuantizedEncoding.from_request(msg).encode(delta, reply, l2_bound=0.3)
    # Stochastic rounding: the same layout and weight, values within one step.
    assert a.shape == b.shape and a[-2:].tolist() == b[-2:].tolist() == [3, 1]


def test_skellam_client_shares_decode_to_the_noised_sum():
    rng = np.random.default_rng(1)
    d, cohort = 64, 4
    params = SkellamParams.calibrate(
        dim=d, clip_norm=1.0, noise_multiplier=0.5, num_clients=cohort, min_clients=cohort
    )
    server = SkellamEncoding(params)
    msg = request(encoding_config(server.request_fields(cohort)))
    assert SkellamEncoding.requested_params(msg) == params
    updates = [rng.normal(0, 0.1, d).astype(np.float32) for _ in range(cohort)]
    encoded = [SkellamEncoding.from_request(msg, params).encode(u) for u in updates]
    assert {e.size for e in encoded} == {server.dimension(d)}
    out = server.decode(summed(encoded, server.bits(cohort)), cohort, d)
    noise_std = 0.5 * 1.0  # z * C on the sum
    assert out.weight == cohort and out.loss is None
    err = out.total.numpy()[:d] - sum(updates)
    assert float(np.std(err)) < 3 * noise_std
