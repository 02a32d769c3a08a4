"""The PRG (AES-256-CTR from counter block 0^96 || 2, whichever engine and API produce it)
and the server's check of advertised X25519 keys."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedveil.privacy.secagg import crypto


def reference_stream(key: bytes, nbytes: int) -> bytes:
    """Plain AES-256-CTR over zeros, straight from `cryptography`."""
    counter = bytes(12) + (2).to_bytes(4, "big")
    encryptor = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
    return encryptor.update(bytes(nbytes)) + encryptor.finalize()


@pytest.fixture(params=[True, False], ids=["gcm-engine", "ctr-engine"])
def engine(request, monkeypatch):
    monkeypatch.setattr(crypto, "_gcm_is_faster", lambda: request.param)
    return request.param


@pytest.mark.parametrize("count", [1, 3, 4, 5, 1000, 100_002])
@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_a_buffer_holds_the_whole_stream_and_is_reused(engine, count, dtype):
    buffer = crypto.KeystreamBuffer(count, dtype)
    for _ in range(2):  # the second key overwrites the first stream completely
        key = os.urandom(32)
        words = buffer.fill(key)
        assert words.shape == (count,) and words.dtype == dtype
        assert words.tobytes() == reference_stream(key, count * np.dtype(dtype).itemsize)


@pytest.mark.parametrize("pieces", [[1, 2, 40], [31, 1, 1, 100], [32, 32], [5, 0, 27, 64], [100]])
def test_reading_in_pieces_continues_the_same_stream(engine, pieces):
    key = os.urandom(32)
    stream = crypto.Keystream(key)
    parts = []
    for size in pieces:
        buffer = bytearray(size)
        stream.fill(buffer)
        parts.append(bytes(buffer))
    assert b"".join(parts) == reference_stream(key, sum(pieces))


def test_keystream_words_are_the_stream_bytes(engine):
    key = os.urandom(32)
    words = crypto.keystream(key, 1001, np.uint64)
    assert words.tobytes() == reference_stream(key, 8 * 1001)


def test_streams_of_different_keys_differ():
    a = crypto.keystream(bytes(32), 64, np.uint32)
    b = crypto.keystream(bytes(31) + b"\1", 64, np.uint32)
    assert not np.array_equal(a, b)


def test_a_stream_beyond_the_counter_range_is_refused(engine):
    with pytest.raises(ValueError, match="at most"):
        crypto.KeystreamBuffer(crypto.MAX_KEYSTREAM_BYTES // 8 + 1, np.uint64)
    stream = crypto.Keystream(os.urandom(32))
    stream._offset = crypto.MAX_KEYSTREAM_BYTES - 16  # as if 64 GiB had been read
    with pytest.raises(ValueError, match="at most"):
        stream.fill(bytearray(64))


def _openssl_refuses(public: bytes) -> bool:
    """Whether a real X25519 agreement with `public` fails."""
    try:
        crypto.KeyPair().agree(public)
    except ValueError:
        return True
    return False


def test_the_small_order_check_agrees_with_openssl():
    p = 2**255 - 19
    special = [0, 1, 2, p - 2, p - 1, p, p + 1, p + 2, 2**255 - 1]
    special += sorted(crypto._SMALL_ORDER_U)
    candidates = []
    for u in special:
        for value in (u, u + p, u | 1 << 255, (u + p) | 1 << 255):
            if value < 2**256:
                candidates.append(value.to_bytes(32, "little"))
    candidates += [os.urandom(32) for _ in range(500)]
    refused = [c for c in candidates if _openssl_refuses(c)]
    assert len(refused) >= 10  # every small-order u, in several encodings
    for public in candidates:
        assert crypto.x25519_unusable(public) == _openssl_refuses(public), public.hex()
    assert crypto.x25519_unusable(bytes(31)) and crypto.x25519_unusable(bytes(33))


def test_sealed_shares_open_only_with_their_key_and_binding():
    key, associated = os.urandom(32), crypto.share_associated_data(bytes(32), 3, 7)
    for nonce in (None, os.urandom(crypto.NONCE_BYTES)):
        sealed = crypto.seal(key, b"share", associated, nonce)
        assert nonce is None or sealed.startswith(nonce)
        assert crypto.open_sealed(key, sealed, associated) == b"share"
        # The direction is bound: the same ciphertext does not open as 7 -> 3.
        assert (
            crypto.open_sealed(key, sealed, crypto.share_associated_data(bytes(32), 7, 3)) is None
        )
        assert crypto.open_sealed(os.urandom(32), sealed, associated) is None
    with pytest.raises(ValueError, match="nonce must be 12 bytes"):
        crypto.seal(key, b"share", associated, bytes(8))


def test_pair_keys_are_the_same_from_both_ends_and_directional_for_shares():
    shared, salt = os.urandom(32), os.urandom(32)
    assert crypto.pairwise_mask_key(shared, salt, 4, 9) == crypto.pairwise_mask_key(
        shared, salt, 9, 4
    )
    send_4, receive_4 = crypto.share_channel_keys(shared, salt, 4, 9)
    send_9, receive_9 = crypto.share_channel_keys(shared, salt, 9, 4)
    assert (send_4, receive_4) == (receive_9, send_9) and send_4 != receive_4
    keys = {crypto.pairwise_mask_key(shared, salt, 4, 9), send_4, receive_4}
    keys.add(crypto.self_mask_key(shared, salt, 4))
    assert len(keys) == 4  # purposes are separated
