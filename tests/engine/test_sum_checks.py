"""secagg.sum_check: the server rejects an unmasked sum no set of honest clipped clients can
produce (a malicious client can send any value modulo 2^b), and honest rounds pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tiny_task
from fedveil.config import load_config
from fedveil.privacy.encodings import QuantizedEncoding
from fedveil.privacy.secagg import decode_message as decode
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.secagg_frame import protocol_part
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.sum_checks import SumRejected, check_quantized_sum
from fedveil.simulations.inprocess import InProcessTransport

ATTACKER = 3
DP = {"dp.mechanism": "central", "dp.epsilon": 50.0, "dp.delta": 1e-3, "dp.clip": 0.1}


def config(tmp_path, name="run", **overrides):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 8,
        "server.per_round": 8,
        "server.rounds": 2,
        "secagg.enabled": True,
        "out": str(tmp_path / name),
    }
    values.update(overrides)
    return load_config(None, values)


class Proxy:
    """The transport, with client ATTACKER's masked input rewritten by `shift(vector, bits)`
    (integers mod 2^b): masks are additive mod 2^b, so adding s to a masked input is
    exactly what a client sends when it adds s to its own input before masking, i.e. a
    malicious client that skips the clip."""

    def __init__(self, inner, channel, shift) -> None:
        self.inner, self.channel, self.shift = inner, channel, shift

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(self, requests, timeout_s, on_reply=None):
        replies = self.inner.exchange(requests, timeout_s)
        reply = replies.get(ATTACKER)
        if requests[ATTACKER].kind == "secagg.masked_input" and isinstance(reply, Envelope):
            masked = np.asarray(decode(*protocol_part(reply)).masked_vector)
            bits = self.channel.last_session.modulus_bits
            key = next(k for k in reply.arrays if k.endswith("masked_vector"))
            shifted = self.shift(masked.astype(object), bits) % (1 << bits)
            reply.arrays[key] = shifted.astype(masked.dtype)
        return replies

    def close(self):
        self.inner.close()


def run(cfg, shift=None):
    task = tiny_task.make(cfg)
    privacy, channel = make_privacy_pipeline(cfg, task, Path(cfg.out + "-ledger.jsonl"))
    with InProcessTransport(task, workers=1) as inner:
        transport = inner if shift is None else Proxy(inner, channel, shift)
        engine = RoundEngine(cfg, task, transport, channel=channel, privacy=privacy)
        before = engine.weights.clone()
        records = [engine.run_round() for _ in range(cfg.server.rounds)]
        return records, before, engine.weights.clone(), engine.model.size


def half_range(cfg, model_size):
    """+r/2 on every model coordinate: every value stays inside [-r, r] (the range check
    passes), the update's norm is r/2 x sqrt(d), far above the clip."""
    step = (cfg.secagg.levels - 1) // 4

    def shift(vector, bits):
        out = vector.copy()
        out[:model_size] += step
        return out

    return shift


def test_under_dp_a_client_that_skips_the_clip_gets_its_round_rejected(tmp_path):
    honest, _, _, size = run(config(tmp_path, "honest", **DP))
    assert all(r.applied for r in honest)
    assert all(r.extra.get("status") != "aborted" for r in honest)

    cfg = config(tmp_path, "attacked", **DP)
    records, before, after, _ = run(cfg, half_range(cfg, size))
    for r in records:
        assert not r.applied
        assert r.extra["status"] == "aborted"
        assert r.extra["aborted_stage"] == "after_unmask"
        assert "sum check: the sum's L2 norm" in r.extra["abort_reason"]
    assert torch.equal(before, after)  # nothing applied


def test_with_the_check_off_that_client_moves_the_model(tmp_path):
    cfg = config(tmp_path, "unchecked", **DP, **{"secagg.sum_check": False})
    _, _, _, size = run(config(tmp_path, "probe", **DP, **{"server.rounds": 1}))
    records, before, after, _ = run(cfg, half_range(cfg, size))
    assert all(r.applied for r in records)
    # The mean update's norm is far above the clip every honest client is held to.
    assert float((after - before).norm()) > 3 * cfg.dp.clip


def test_without_a_clip_a_client_outside_the_range_is_caught_only_when_it_leaves_n_r(tmp_path):
    """No DP: only the range check. A value that lands above n x (L - 1) is rejected; one
    that wraps back into range (the attacker picks it, knowing the modulus) passes: the
    limit docs/how-to/robust-aggregation.md documents."""
    cfg = config(tmp_path, "gap", **{"server.per_round": 5, "data.num_clients": 5})
    n, top = 5, cfg.secagg.levels - 1

    def above(vector, bits):
        out = vector.copy()
        # Honest updates are small, so the honest sum sits near n(L-1)/2; + n(L-1) puts it
        # in (n(L-1), 2^b) for n = 5 (2^b = 2^23 > 1.5 x 5(L-1)): no wrap.
        assert 1.5 * n * top < 1 << bits
        out[0] += n * top
        return out

    records, before, after, _ = run(cfg, above)
    for r in records:
        assert not r.applied
        assert r.extra["abort_reason"].startswith("sum check: coordinate 0 of the sum")
    assert torch.equal(before, after)


def encoded(q, vector, weight, clip=None):
    return q.encode_weighted([vector.astype(np.float32)], weight, l2_bound=clip).astype(np.uint64)


@pytest.mark.parametrize("weights", [(1, 1, 1, 1), (3, 7, 10, 1)])
def test_honest_clipped_clients_pass_the_norm_check_at_the_bound(weights):
    """Every client's update sits at the clip C, all aligned: the largest honest sum."""
    enc = QuantizedEncoding(clip_range=1.0, levels=2**16, max_weight=10, max_clients=4)
    q = enc.quantizer(4)
    clip, dim = 0.5, 64
    direction = np.ones(dim) / np.sqrt(dim)
    total = sum(encoded(q, direction * clip, w, clip) for w in weights)
    norm = check_quantized_sum(total, enc, 4, dim, clip)
    assert norm is not None and norm <= sum(weights) / 10 * clip * (1 + 1e-9)


def test_an_in_range_update_above_the_clip_is_rejected_under_dp():
    """DP's unit weights: the attacker stays inside [-r, r] per coordinate (the range check
    passes) but skips the L2 clip: the sum's norm exceeds n x C."""
    enc = QuantizedEncoding(clip_range=1.0, levels=2**16, max_weight=1, max_clients=4)
    q = enc.quantizer(4)
    clip, dim = 0.5, 64
    rng = np.random.default_rng(0)
    honest = [encoded(q, rng.normal(size=dim) * 0.01, 1, clip) for _ in range(3)]
    check_quantized_sum(sum(honest[:2]), enc, 2, dim, clip)  # honest: passes
    attacker = encoded(q, np.full(dim, 0.9), 1)  # norm 0.9 x 8 = 7.2 > C, every value < r
    with pytest.raises(SumRejected, match=r"L2 norm .* exceeds what 4 contributors"):
        check_quantized_sum(sum(honest) + attacker, enc, 4, dim, clip)


def test_a_forged_weight_is_rejected():
    enc = QuantizedEncoding(clip_range=1.0, levels=2**10, max_weight=5, max_clients=3)
    q = enc.quantizer(3)
    total = sum(encoded(q, np.zeros(8), 5) for _ in range(3))
    check_quantized_sum(total, enc, 3, 8, None)
    total[-2] += 1  # one client claims weight 6 > max_weight
    with pytest.raises(SumRejected, match="total weight 16 exceeds 3 contributors"):
        check_quantized_sum(total, enc, 3, 8, None)
