"""Secure all-reduce among silos in threads (real gloo groups on a loopback TCP store, no
child process): the signed wire's widths, the masked-chunk check against its control, and
forged adverts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from silo_checks import leaked_partial_sums

from fedveil.client.silo import SecureAllReduce
from fedveil.client.silo.adverts import SiloAuthError
from fedveil.client.silo.collectives import REDUCE_SCATTER, Received, ring_all_reduce
from fedveil.client.silo.local import run_silos
from fedveil.client.silo.signed_wire import to_wire, wire_dtype
from fedveil.privacy.secagg import Quantizer
from fedveil.privacy.secagg.identity_keys import DerivedIdentities

WORLD = 4


def test_wire_width_leaves_room_for_the_signed_sum():
    assert wire_dtype(29, 4) == torch.int32  # 29 + 2 = 31
    assert wire_dtype(30, 4) == torch.int64  # 32 > 31
    assert wire_dtype(29, 5) == torch.int64  # ceil(log2 5) = 3
    assert wire_dtype(61, 4) == torch.int64
    with pytest.raises(ValueError, match="62 \\+ ceil\\(log2 4 silos\\) = 64 > 63"):
        wire_dtype(62, 4)


@pytest.mark.parametrize("bits", [29, 30, 32])
def test_largest_values_sum_modulo_2b_without_signed_overflow(bits):
    top = (1 << bits) - 1
    dtype = np.uint32 if bits <= 32 else np.uint64
    vectors = [np.full(1000, top - s, dtype=dtype) for s in range(WORLD)]

    def body(silo: SecureAllReduce) -> np.ndarray:
        return silo.sum(1, vectors[silo.settings.silo], bits).total

    totals = run_silos(WORLD, body, run_id=f"wire-{bits}", timeout_s=20)
    expected = sum(int(v[0]) for v in vectors) % (1 << bits)
    for total in totals:
        assert total.dtype == dtype and np.all(total == expected)


def _encoded(silo: int, q: Quantizer) -> np.ndarray:
    update = np.random.default_rng(silo).uniform(-0.9, 0.9, 999).astype(np.float32)
    return q.encode_weighted(update, 1, seed=bytes([silo]) * 32)


def test_ring_chunks_are_masked_and_the_check_finds_unmasked_ones():
    """Control and claim on the same groups: the ring without masks hands a silo the
    unmasked partial sums (the check finds them); with masks, no chunk matches any."""
    q = Quantizer(1.0, 2**12, WORLD, 1)
    encoded = {s: _encoded(s, q) for s in range(WORLD)}

    def body(silo: SecureAllReduce) -> tuple[list, list]:
        s = silo.settings.silo
        prepared = silo.prepare(1, 0, encoded[s].size, q.bits)
        plain = Received()
        ring_all_reduce(prepared.group, to_wire(encoded[s].copy(), q.bits, WORLD), plain)
        silo.received = Received()
        silo.reduce(prepared, encoded[s])
        return plain.chunks, silo.received.chunks

    results = run_silos(WORLD, body, run_id="masked", timeout_s=20, collective="ring")
    for plain, masked in results:

        def scattered(chunks: list) -> list[tuple[int, np.ndarray]]:
            return [(c[3], c[4].numpy()) for c in chunks if c[1] == REDUCE_SCATTER]

        assert len(leaked_partial_sums(scattered(plain), encoded, q.bits)) == WORLD - 1
        assert leaked_partial_sums(scattered(masked), encoded, q.bits) == []


class _ImpostorAt(DerivedIdentities):
    """Silo `impostor` signs with a key the roster does not list for it."""

    def __init__(self, impostor: int) -> None:
        super().__init__()
        self.impostor = impostor
        self.other = DerivedIdentities()
        self.roster = DerivedIdentities(self._secret).roster  # the honest keys

    def private_key(self, client_id: int):  # type: ignore[no-untyped-def]
        if client_id == self.impostor:
            return self.other.private_key(client_id)
        return super().private_key(client_id)


def test_an_advert_not_signed_by_the_rostered_key_fails_the_round_closed():
    def body(silo: SecureAllReduce) -> np.ndarray:
        return silo.sum(1, np.zeros(16, np.uint32), 20).total

    with pytest.raises(RuntimeError, match="silo 0") as caught:
        run_silos(WORLD, body, run_id="forged", timeout_s=10, identities=_ImpostorAt(3))
    assert isinstance(caught.value.__cause__, SiloAuthError)
    assert "silo 3: advert signature does not verify" in str(caught.value.__cause__)


def test_pipelined_pieces_sum_to_the_weighted_mean_within_the_quantisation_bound():
    from fedveil.client.silo.round import weighted_encoder

    dim, weights = 3 * (1 << 16) + 5, [3, 1, 4, 2]  # three pieces, the last with [w, 1]
    q = Quantizer(1.0, 2**14, WORLD, max(weights))
    updates = [
        np.random.default_rng(s).uniform(-0.9, 0.9, dim).astype(np.float32) for s in range(WORLD)
    ]

    def body(silo: SecureAllReduce) -> tuple[np.ndarray, dict]:
        s = silo.settings.silo
        assert len(silo._pieces(dim + 2)) == 3
        result = silo.sum(1, weighted_encoder(q, updates[s], weights[s]), q.bits)
        return result.total, result.seconds

    results = run_silos(WORLD, body, run_id="pieces", timeout_s=30, pipeline_pieces=8)
    expected = sum(w * u.astype(np.float64) for w, u in zip(weights, updates, strict=True))
    expected /= sum(weights)
    for total, seconds in results:
        assert np.array_equal(total, results[0][0])
        mean, weight, count = q.decode_weighted_mean(total)
        assert (weight, count) == (sum(weights), WORLD)
        assert np.max(np.abs(mean[:dim] - expected)) <= q.sum_error_bound(WORLD) * q.max_weight
        assert seconds["encode_mask_send_cpu"] > 0 and "collective_wait_wall" in seconds


def test_rounding_drawn_before_the_span_gives_the_exact_sum_and_the_same_decode():
    """`prepare` draws each silo's rounding randomness and wire buffer; `reduce` (one piece,
    the default) then returns exactly the sum of the integers those offsets round the
    updates to, and the fused decode is decode_weighted_mean's, bit for bit."""
    from fedveil.client.silo.round import weighted_encoder

    dim, weights = 70_001, [2, 1, 3, 1]
    q = Quantizer(1.0, 2**16, WORLD, max(weights))
    updates = [np.random.default_rng(s).normal(0, 0.5, dim).astype(np.float32) for s in range(4)]

    def body(silo: SecureAllReduce) -> tuple[np.ndarray, np.ndarray, dict]:
        s = silo.settings.silo
        assert silo._pieces(dim + 2) == [(0, dim + 2)]
        prepared = silo.prepare(1, 0, dim + 2, q.bits, rounding=q)
        assert prepared.offsets is not None and prepared.offsets.shape == (dim + 2,)
        assert set(prepared.seconds) >= {"rounding_cpu", "buffers_cpu", "masks_cpu"}
        total, seconds = silo.reduce(prepared, weighted_encoder(q, updates[s], weights[s]))
        with pytest.raises(ValueError, match="its masks are used once, already were"):
            silo.reduce(prepared, weighted_encoder(q, updates[s], weights[s]))
        return total.copy(), prepared.offsets, seconds

    results = run_silos(WORLD, body, run_id="drawn-ahead", timeout_s=30)
    expected = np.zeros(dim, np.uint64)
    for s, (_, offsets, _) in enumerate(results):
        rounded = np.empty(dim, np.uint32)
        q.quantize_masked_into(
            updates[s],
            offsets[:dim],
            np.zeros(dim, np.uint32),
            rounded,
            scale=weights[s] / q.max_weight,
        )
        expected += rounded
    for total, _, seconds in results:
        assert np.array_equal(total[:dim], expected) and list(total[dim:]) == [sum(weights), 4]
        assert not any(key.startswith(("rounding", "masks", "keys")) for key in seconds)
        mean = np.empty(dim, np.float32)
        assert q.decode_weighted_mean_into(total, mean) == (sum(weights), WORLD)
        assert np.array_equal(mean, q.decode_weighted_mean(total)[0].astype(np.float32))


def test_a_round_prepared_while_the_silo_trains_sums_with_that_attempt():
    """SiloRound.prepare starts attempt 0 (keys, masks, rounding randomness) on a background
    thread; `run` then sums with it, not with a second attempt or a second prepare."""
    from fedveil.client.silo import SiloRound

    dim, weights = 5_000, [1, 2, 3, 4]
    q = Quantizer(1.0, 2**12, WORLD, max(weights))
    updates = [
        np.random.default_rng(s).uniform(-0.9, 0.9, dim).astype(np.float32) for s in range(4)
    ]

    def body(silo: SecureAllReduce) -> tuple:
        s = silo.settings.silo
        rounds = SiloRound(silo, quantizer=q)
        ahead = rounds.prepare(1, dim)
        assert ahead is not None
        prepared = ahead.result(timeout=60)  # the silo would be training meanwhile
        return rounds.run(1, updates[s], weights[s]), prepared

    results = run_silos(WORLD, body, run_id="ahead", timeout_s=30)
    expected = sum(w * u.astype(np.float64) for w, u in zip(weights, updates, strict=True))
    expected /= sum(weights)
    for result, prepared in results:
        assert result.attempt == 0 and result.members == (0, 1, 2, 3)
        assert result.seconds["masks_cpu"] == prepared.seconds["masks_cpu"]  # that attempt
        assert np.max(np.abs(result.mean - expected)) <= q.sum_error_bound(WORLD) * q.max_weight
