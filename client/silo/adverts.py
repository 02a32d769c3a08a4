"""Signed key adverts among silos and the pairwise mask keys they yield.

The rendezvous store (torch.distributed's TCP store) is unauthenticated: anyone who
reaches it may write. So each silo publishes, per attempt, a fresh X25519 public key
signed with its long-term Ed25519 identity (the roster of silo ids -> public keys comes
from the operator, as for devices: privacy/secagg/identity.py), and every silo verifies
each peer's advert against its own roster before agreeing a key. A forged, missing or
small-order advert aborts the attempt, naming the silo.

The attempt digest binds run, round, attempt and the ordered member list: it salts every
derived key (`crypto.pairwise_mask_key`) and is covered by every signature, so an advert
or a mask never carries over from an aborted attempt to its rerun.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from torch.distributed import Store

from fedveil.privacy.secagg import crypto

DOMAIN = b"fedveil/silo-allreduce/v1/"
ADVERT_BYTES = crypto.KEY_BYTES + crypto.SIGNATURE_BYTES


class SiloAuthError(Exception):
    """A peer's advert failed a check (names the silo and the check). Not a RuntimeError:
    a forgery fails the round closed instead of being retried like a dead silo."""


@dataclass(frozen=True)
class Attempt:
    """One try of one round's sum among `members` (silo ids, in rank order)."""

    run_id: str
    round: int
    attempt: int
    members: tuple[int, ...]

    @property
    def digest(self) -> bytes:
        body = json.dumps(
            {
                "run": self.run_id,
                "round": self.round,
                "attempt": self.attempt,
                "members": list(self.members),
            },
            sort_keys=True,
        ).encode()
        return hashlib.sha256(DOMAIN + body).digest()

    @property
    def prefix(self) -> str:
        return f"{self.run_id}/r{self.round}/a{self.attempt}/"


def _transcript(digest: bytes, silo: int, public: bytes) -> bytes:
    return b"silo-advert" + digest + crypto.party_id(silo) + public


def exchange_mask_keys(
    store: Store,
    attempt: Attempt,
    silo: int,
    identity: Ed25519PrivateKey,
    roster: Mapping[int, bytes],
    timeout_s: float,
) -> dict[int, bytes]:
    """Publish this silo's signed advert and return {peer: pairwise mask key}.

    A fresh X25519 key pair per attempt (OS CSPRNG); waits at most `timeout_s` for the
    peers' adverts. Raises SiloAuthError when a peer's advert is absent from the roster,
    malformed, badly signed or of small order.
    """
    keys = crypto.KeyPair()
    digest = attempt.digest
    signature = crypto.sign(identity, _transcript(digest, silo, keys.public_bytes))
    store.set(attempt.prefix + f"advert/{silo}", keys.public_bytes + signature)
    peers = [m for m in attempt.members if m != silo]
    names = [attempt.prefix + f"advert/{peer}" for peer in peers]
    store.wait(names, timedelta(seconds=timeout_s))
    out: dict[int, bytes] = {}
    for peer, name in zip(peers, names, strict=True):
        advert = bytes(store.get(name))
        public, sig = advert[: crypto.KEY_BYTES], advert[crypto.KEY_BYTES :]
        listed = roster.get(peer)
        if listed is None:
            raise SiloAuthError(f"silo {peer}: not in this silo's roster")
        if len(advert) != ADVERT_BYTES:
            raise SiloAuthError(
                f"silo {peer}: advert of {len(advert)} bytes, {ADVERT_BYTES} expected"
            )
        if not crypto.verify(
            crypto.load_identity_public(listed), sig, _transcript(digest, peer, public)
        ):
            raise SiloAuthError(f"silo {peer}: advert signature does not verify against the roster")
        if crypto.x25519_unusable(public):
            raise SiloAuthError(f"silo {peer}: advertised X25519 key of small order")
        out[peer] = crypto.pairwise_mask_key(keys.agree(public), digest, silo, peer)
    return out
