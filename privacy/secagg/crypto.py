"""Thin wrappers over `cryptography`: every primitive the protocol uses, with domain separation.

* Key agreement: X25519. Key derivation: HKDF-SHA256 whose salt is the session digest and whose
  info names the purpose and both party ids, so keys never repeat across sessions, pairs,
  directions or purposes.
* PRG: AES-256-CTR keystream from the fixed counter block 0^96 || 2 (see KeystreamBuffer);
  safe because every derived key is used for exactly one stream.
* Share encryption: AES-256-GCM, random 96-bit nonce, associated data binding the session,
  sender and receiver.
* Signatures: Ed25519 (long-term identity keys, malicious mode only).
"""

from __future__ import annotations

import functools
import hashlib
import struct
import time
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import randomness

# v2: the PRG starts at counter block 0^96 || 2 (v1 started at 0), so v1 masks differ.
# v3: sessions name their run and round (session.py): v2 digests and keys differ.
DOMAIN = b"fedveil/secagg/v3/"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SIGNATURE_BYTES = 64
_SHA256 = hashes.SHA256()


def party_id(client_id: int) -> bytes:
    return struct.pack(">Q", client_id)


def _pair_id(a: int, b: int) -> bytes:
    """Both party ids, smaller first: the same bytes from either end of the pair."""
    return struct.pack(">QQ", a, b) if a < b else struct.pack(">QQ", b, a)


def derive_key(ikm: bytes, *, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 to one 256-bit key; `info` gets the protocol domain prefix."""
    return derive_keys(ikm, salt=salt, info=info, count=1)[0]


def derive_keys(ikm: bytes, *, salt: bytes, info: bytes, count: int) -> list[bytes]:
    """`count` independent 256-bit keys from one HKDF-SHA256 output (split into 32-byte parts)."""
    okm = HKDF(_SHA256, KEY_BYTES * count, salt, DOMAIN + info).derive(ikm)
    if count == 1:
        return [okm]
    return [okm[i : i + KEY_BYTES] for i in range(0, len(okm), KEY_BYTES)]


def keystream(key: bytes, count: int, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """`count` uniform words of `dtype` from the keystream of `key`."""
    return KeystreamBuffer(count, dtype).fill(key).copy()


# The PRG is AES-256-CTR whose first counter block is 0^96 || 2: exactly the blocks AES-GCM
# encrypts with under the all-zero 96-bit nonce (GCM increments the low 32 bits only, so the
# stream is capped at 2^32 - 2 blocks, 64 GiB). Every derived key is used for one stream only,
# so the fixed counter is safe. Where OpenSSL runs GCM on wider AES units than plain CTR
# (VAES), the GCM engine is ~1.5x faster; `_gcm_is_faster` picks the engine once per process
# by timing both. The output is the same either way; the GCM tag is discarded.
_GCM_NONCE = bytes(12)
_FIRST_COUNTER = _GCM_NONCE + (2).to_bytes(4, "big")
MAX_KEYSTREAM_BYTES = ((1 << 32) - 2) * 16


def _check_length(nbytes: int) -> None:
    if nbytes > MAX_KEYSTREAM_BYTES:
        raise ValueError(f"keystream of {nbytes} bytes: at most {MAX_KEYSTREAM_BYTES}")


class KeystreamBuffer:
    """A reusable array that whole keystreams are written into, one key per `fill`.

    The one-shot AES-GCM call writes its 16-byte tag after the data, so the array sits on
    storage 16 bytes longer than it: no copy, and no per-call cipher-context setup.
    """

    def __init__(self, count: int, dtype: type[np.unsignedinteger]) -> None:
        itemsize = np.dtype(dtype).itemsize
        self._nbytes = count * itemsize
        _check_length(self._nbytes)
        storage = np.empty(count + -(-TAG_BYTES // itemsize), dtype=dtype)
        self.array = storage[:count]
        self._storage = memoryview(storage).cast("B")[: self._nbytes + TAG_BYTES]

    def fill(self, key: bytes) -> np.ndarray:
        """`array`, overwritten with the keystream of `key`."""
        zeros = _zeros(self._nbytes)
        if _gcm_is_faster():
            AESGCM(key).encrypt_into(_GCM_NONCE, zeros, None, self._storage)
        else:
            _ctr(key).update_into(zeros, self._storage[: self._nbytes])
        return self.array


class Keystream:
    """The keystream of `key`, read in consecutive pieces (streaming, for chunked work)."""

    def __init__(self, key: bytes) -> None:
        self._encryptor = (
            Cipher(algorithms.AES(key), modes.GCM(_GCM_NONCE)).encryptor()
            if _gcm_is_faster()
            else _ctr(key)
        )
        self._offset = 0

    def fill(self, out: np.ndarray | memoryview | bytearray) -> None:
        """Write the next len(out) bytes of the stream into `out` (C-contiguous)."""
        view = memoryview(out).cast("B")
        self._offset += len(view)
        _check_length(self._offset)
        if len(view):
            self._encryptor.update_into(_zeros(len(view)), view)


def _ctr(key: bytes) -> Any:
    return Cipher(algorithms.AES(key), modes.CTR(_FIRST_COUNTER)).encryptor()


_zero_pool = bytes(0)


def _zeros(nbytes: int) -> memoryview:
    """A read-only run of zero bytes, reused across calls (allocated once per size class)."""
    global _zero_pool
    if len(_zero_pool) < nbytes:
        _zero_pool = bytes(max(nbytes, 2 * len(_zero_pool)))
    return memoryview(_zero_pool)[:nbytes]


@functools.cache
def _gcm_is_faster() -> bool:
    """Whether this machine's OpenSSL makes the keystream faster through GCM (see above)."""
    key, size = bytes(32), 1 << 18
    buffer = bytearray(size + TAG_BYTES)
    ctr, gcm = [], []
    for _ in range(3):
        started = time.perf_counter()
        _ctr(key).update_into(_zeros(size), memoryview(buffer)[:size])
        ctr.append(time.perf_counter() - started)
        started = time.perf_counter()
        AESGCM(key).encrypt_into(_GCM_NONCE, _zeros(size), None, buffer)
        gcm.append(time.perf_counter() - started)
    return min(gcm) < min(ctr)


class KeyPair:
    """An X25519 key pair whose private half came from `randomness.random_bytes`."""

    def __init__(self, private_bytes: bytes | None = None) -> None:
        raw = randomness.random_bytes(KEY_BYTES) if private_bytes is None else private_bytes
        self._private = X25519PrivateKey.from_private_bytes(raw)
        self.private_bytes = raw
        self.public_bytes = self._private.public_key().public_bytes_raw()

    def agree(self, peer_public: bytes) -> bytes:
        """Raw X25519 shared secret; raises ValueError for invalid or low-order points."""
        return self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))


_P25519 = 2**255 - 19
# The u-coordinates (mod p) of the points of order dividing 8 on Curve25519 and its twist.
# X25519 with any of them gives the all-zero secret, which OpenSSL refuses (RFC 7748 §6.1);
# tests/privacy/secagg/test_secagg_crypto_primitives.py checks this set against OpenSSL itself.
_SMALL_ORDER_U = frozenset(
    {
        0,
        1,
        _P25519 - 1,
        325606250916557431795983626356110631294008115727848805560023387167927233504,
        39382357235489614581723060781553021112529911719440698176882885853963445705823,
    }
)


def x25519_unusable(public: bytes) -> bool:
    """Whether every key agreement with `public` would fail (wrong length or small order).

    Same answer as attempting one agreement, without the scalar multiplication: the server
    checks every advertised key, two per client per round.
    """
    if len(public) != KEY_BYTES:
        return True
    u = (int.from_bytes(public, "little") & ((1 << 255) - 1)) % _P25519  # bit 255 is ignored
    return u in _SMALL_ORDER_U


def pairwise_mask_key(shared: bytes, salt: bytes, a: int, b: int) -> bytes:
    """Same key for (a, b) and (b, a): both ends expand the same mask."""
    return derive_key(shared, salt=salt, info=b"pairwise-mask" + _pair_id(a, b))


def self_mask_key(seed: bytes, salt: bytes, owner: int) -> bytes:
    return derive_key(seed, salt=salt, info=b"self-mask" + party_id(owner))


def share_channel_keys(shared: bytes, salt: bytes, me: int, peer: int) -> tuple[bytes, bytes]:
    """(send key me→peer, receive key peer→me): directional, so the two ciphertexts of a pair
    never share a key. Both ends derive the same two keys from one HKDF call."""
    info = b"share-encryption" + _pair_id(me, peer)
    up, down = derive_keys(shared, salt=salt, info=info, count=2)
    return (up, down) if me < peer else (down, up)


def share_associated_data(session_digest: bytes, sender: int, receiver: int) -> bytes:
    return DOMAIN + b"share" + session_digest + struct.pack(">QQ", sender, receiver)


def seal(key: bytes, plaintext: bytes, associated_data: bytes, nonce: bytes | None = None) -> bytes:
    """nonce || AES-GCM(plaintext); `nonce`: 12 bytes from `randomness` (a batch of them is
    drawn in one call by a sender sealing many messages), a fresh draw if omitted."""
    if nonce is None:
        nonce = randomness.random_bytes(NONCE_BYTES)
    elif len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated_data)


def open_sealed(key: bytes, ciphertext: bytes, associated_data: bytes) -> bytes | None:
    """Plaintext, or None when the tag (or anything it covers) does not verify."""
    if len(ciphertext) < NONCE_BYTES + TAG_BYTES:
        return None
    nonce, body = ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:]
    try:
        return AESGCM(key).decrypt(nonce, body, associated_data)
    except InvalidTag:
        return None


def seed_commitment(session_digest: bytes, owner: int, seed: bytes) -> bytes:
    """Binding, hiding (256-bit random seed) commitment the server checks reconstructions with."""
    return hashlib.sha256(
        DOMAIN + b"seed-commitment" + session_digest + party_id(owner) + seed
    ).digest()


def sign(identity_key: Ed25519PrivateKey, message: bytes) -> bytes:
    return identity_key.sign(DOMAIN + message)


def verify(identity_public: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        identity_public.verify(signature, DOMAIN + message)
    except InvalidSignature:
        return False
    return True


def load_identity_public(key: Ed25519PublicKey | bytes) -> Ed25519PublicKey:
    if isinstance(key, Ed25519PublicKey):
        return key
    return Ed25519PublicKey.from_public_bytes(bytes(key))


def advert_transcript(
    session_digest: bytes, owner: int, mask_public: bytes, enc_public: bytes, commitment: bytes
) -> bytes:
    """What a client signs in malicious mode when advertising its round keys."""
    return b"advertise" + session_digest + party_id(owner) + mask_public + enc_public + commitment


def survivors_transcript(session_digest: bytes, signer: int, survivors: bytes) -> bytes:
    """What a client signs in the consistency round: its view of the survivor set U3."""
    return b"consistency" + session_digest + party_id(signer) + survivors
