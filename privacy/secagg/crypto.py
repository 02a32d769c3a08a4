"""Thin wrappers over `cryptography`: every primitive the protocol uses, with domain separation.

* Key agreement: X25519. Key derivation: HKDF-SHA256 whose salt is the session digest and whose
  info names the purpose and both party ids, so keys never repeat across sessions, pairs,
  directions or purposes.
* PRG: AES-256-CTR keystream with an all-zero counter block; safe because every derived key
  is used for exactly one stream.
* Share encryption: AES-256-GCM, random 96-bit nonce, associated data binding the session,
  sender and receiver.
* Signatures: Ed25519 (long-term identity keys, malicious mode only).
"""

from __future__ import annotations

import hashlib
import struct

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

DOMAIN = b"fedveil/secagg/v1/"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SIGNATURE_BYTES = 64
_ZERO_COUNTER = bytes(16)


def party_id(client_id: int) -> bytes:
    return struct.pack(">Q", client_id)


def derive_key(ikm: bytes, *, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 to one 256-bit key; `info` gets the protocol domain prefix."""
    return derive_keys(ikm, salt=salt, info=info, count=1)[0]


def derive_keys(ikm: bytes, *, salt: bytes, info: bytes, count: int) -> list[bytes]:
    """`count` independent 256-bit keys from one HKDF-SHA256 output (split into 32-byte parts)."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES * count, salt=salt, info=DOMAIN + info)
    okm = hkdf.derive(ikm)
    return [okm[i : i + KEY_BYTES] for i in range(0, len(okm), KEY_BYTES)]


def keystream(key: bytes, count: int, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """`count` uniform words of `dtype` from AES-256-CTR(key)."""
    out = np.empty(count, dtype=dtype)
    keystream_into(key, out)
    return out


def keystream_into(key: bytes, out: np.ndarray) -> None:
    """Fill the contiguous array `out` with AES-256-CTR(key) bytes, without temporaries."""
    view = memoryview(out).cast("B")
    encryptor = Cipher(algorithms.AES(key), modes.CTR(_ZERO_COUNTER)).encryptor()
    # Encrypting zeros yields the raw keystream (CTR is a stream cipher).
    encryptor.update_into(_zeros(len(view)), view)


_zero_pool = bytes(0)


def _zeros(nbytes: int) -> memoryview:
    """A read-only run of zero bytes, reused across calls (allocated once per size class)."""
    global _zero_pool
    if len(_zero_pool) < nbytes:
        _zero_pool = bytes(max(nbytes, 2 * len(_zero_pool)))
    return memoryview(_zero_pool)[:nbytes]


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


def x25519_public(private_bytes: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private_bytes).public_key().public_bytes_raw()


def pairwise_mask_key(shared: bytes, salt: bytes, a: int, b: int) -> bytes:
    """Same key for (a, b) and (b, a): both ends expand the same mask."""
    low, high = sorted((a, b))
    return derive_key(shared, salt=salt, info=b"pairwise-mask" + party_id(low) + party_id(high))


def self_mask_key(seed: bytes, salt: bytes, owner: int) -> bytes:
    return derive_key(seed, salt=salt, info=b"self-mask" + party_id(owner))


def share_channel_keys(shared: bytes, salt: bytes, me: int, peer: int) -> tuple[bytes, bytes]:
    """(send key me→peer, receive key peer→me): directional, so the two ciphertexts of a pair
    never share a key. Both ends derive the same two keys from one HKDF call."""
    low, high = sorted((me, peer))
    up, down = derive_keys(
        shared, salt=salt, info=b"share-encryption" + party_id(low) + party_id(high), count=2
    )
    return (up, down) if me == low else (down, up)


def share_associated_data(session_digest: bytes, sender: int, receiver: int) -> bytes:
    return DOMAIN + b"share" + session_digest + party_id(sender) + party_id(receiver)


def seal(key: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    nonce = randomness.random_bytes(NONCE_BYTES)
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
