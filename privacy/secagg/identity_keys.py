"""Client identity keys and the roster that binds them to client ids (malicious mode).

Against a malicious server, a client must check its neighbours' key
advertisements and consistency signatures with keys the server cannot
substitute. Each client holds a long-term Ed25519 identity key; a *roster*
maps client ids to their public keys and reaches every client from the
operator, outside the coordinator (a file the device is started with). A
server that invents clients, or swaps a key, cannot produce signatures that
verify against the client's own roster, and the round aborts.

* `Roster`            – client id -> raw 32-byte Ed25519 public key, a strict JSON codec
                        and a fingerprint to compare copies out of band.
* `ClientIdentity`    – one client's private key with the roster it trusts.
* `DerivedIdentities` – a simulated population's keys, derived from one secret
                        from the OS CSPRNG (simulation only: every simulated client
                        lives in one trust domain anyway).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import crypto

ROSTER_FORMAT = "fedveil-secagg-roster/1"
MAX_CLIENT_ID = 1_000_000  # as client enrolment
MAX_ROSTER_CLIENTS = 1_000_000
KEY_BYTES = 32


class RosterError(ValueError):
    """A roster or identity key that cannot be used; the message names the field."""


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def encode_public(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def decode_public(text: Any, field: str) -> bytes:
    """A base64 Ed25519 public key; RosterError naming `field` otherwise."""
    if not isinstance(text, str):
        raise RosterError(f"{field}: must be a base64 string of a 32-byte Ed25519 public key")
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise RosterError(f"{field}: not valid base64") from None
    if len(raw) != KEY_BYTES:
        raise RosterError(f"{field}: {len(raw)} bytes, an Ed25519 public key has {KEY_BYTES}")
    try:
        crypto.load_identity_public(raw)
    except ValueError as exc:
        raise RosterError(f"{field}: not an Ed25519 public key ({exc})") from None
    return raw


class Roster(Mapping[int, bytes]):
    """Client id -> raw Ed25519 identity public key. Immutable; one key per client and
    each key for one client only (a key listed twice would let one device sign as two)."""

    def __init__(self, keys: Mapping[int, bytes]) -> None:
        if len(keys) > MAX_ROSTER_CLIENTS:
            raise RosterError(f"clients: {len(keys)} entries, at most {MAX_ROSTER_CLIENTS}")
        owner: dict[bytes, int] = {}
        checked: dict[int, bytes] = {}
        for cid, raw in keys.items():
            if isinstance(cid, bool) or not isinstance(cid, int) or not 0 <= cid < MAX_CLIENT_ID:
                raise RosterError(f"clients: id {cid!r} must be an integer in [0, {MAX_CLIENT_ID})")
            raw = bytes(raw)
            if len(raw) != KEY_BYTES:
                raise RosterError(f"clients.{cid}: {len(raw)} bytes, expected {KEY_BYTES}")
            if raw in owner:
                raise RosterError(
                    f"clients.{cid}: the same key as client {owner[raw]}; each client needs "
                    "its own identity key"
                )
            owner[raw] = cid
            checked[cid] = raw
        self._keys = dict(sorted(checked.items()))

    def __getitem__(self, cid: int) -> bytes:
        return self._keys[cid]

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def fingerprint(self) -> str:
        """SHA-256 over the sorted (id, key) pairs: equal rosters, equal fingerprints."""
        h = hashlib.sha256(ROSTER_FORMAT.encode())
        for cid, raw in self._keys.items():
            h.update(cid.to_bytes(8, "big") + raw)
        return h.hexdigest()

    def to_json(self) -> str:
        clients = {str(cid): encode_public(raw) for cid, raw in self._keys.items()}
        return json.dumps({"format": ROSTER_FORMAT, "clients": clients}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Roster:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RosterError(f"roster: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise RosterError("roster: must be a JSON object")
        if data.get("format") != ROSTER_FORMAT:
            raise RosterError(f"format: {data.get('format')!r}, expected {ROSTER_FORMAT!r}")
        clients = data.get("clients")
        if not isinstance(clients, dict):
            raise RosterError("clients: must be an object of client id -> base64 public key")
        keys: dict[int, bytes] = {}
        for name, text_key in clients.items():
            if not (name.isascii() and name.isdigit()) or len(name) > 7:
                raise RosterError(f"clients: key {name[:20]!r} is not a client id")
            keys[int(name)] = decode_public(text_key, f"clients.{name}")
        return cls(keys)


@dataclass(frozen=True, repr=False)
class ClientIdentity:
    """A client's identity key and the roster it verifies its peers with.

    A client with an identity takes part only in malicious-server sessions: it means
    to be protected from the server, and a server that could switch it to the
    semi-honest protocol (no signatures, no consistency round) would remove that
    protection."""

    client_id: int
    key: Ed25519PrivateKey
    roster: Mapping[int, bytes]

    def __post_init__(self) -> None:
        listed = self.roster.get(self.client_id)
        if listed is None:
            raise RosterError(f"roster: has no key for client {self.client_id}")
        if listed != public_bytes(self.key):
            raise RosterError(
                f"roster: the key listed for client {self.client_id} is not this identity "
                "key's public key"
            )

    def peer_keys(self, client_ids: Any) -> dict[int, bytes]:
        """The roster's keys of `client_ids` (a session's cohort); absent ids are left out,
        and a client asked to trust one of them refuses the session, naming it."""
        roster = self.current_roster()
        return {cid: roster[cid] for cid in client_ids if cid in roster}

    def current_roster(self) -> Mapping[int, bytes]:
        """The roster a session is checked against (a device re-reads its file here)."""
        return self.roster

    def __repr__(self) -> str:  # never the key
        return f"ClientIdentity(client_id={self.client_id}, roster={len(self.roster)} keys)"


class DerivedIdentities:
    """Identity keys of a simulated population: client i's Ed25519 key is derived by
    HKDF-SHA256 from one 32-byte secret (OS CSPRNG) and i, so worker processes can
    rebuild any client's key from the secret alone. `roster` derives public keys
    lazily: a cohort's keys cost microseconds, not the whole population's."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = os.urandom(32) if secret is None else bytes(secret)
        if len(self._secret) != 32:
            raise ValueError("DerivedIdentities: the secret must be 32 bytes")
        self._public: dict[int, bytes] = {}
        self._identities: dict[int, ClientIdentity] = {}
        self.roster: Mapping[int, bytes] = _DerivedRoster(self)

    def private_key(self, client_id: int) -> Ed25519PrivateKey:
        seed = crypto.derive_key(
            self._secret,
            salt=b"",
            info=b"fedveil/sim-identity/v1/" + client_id.to_bytes(8, "big"),
        )
        return Ed25519PrivateKey.from_private_bytes(seed)

    def public_key(self, client_id: int) -> bytes:
        raw = self._public.get(client_id)
        if raw is None:
            raw = self._public[client_id] = public_bytes(self.private_key(client_id))
        return raw

    def identity(self, client_id: int) -> ClientIdentity:
        found = self._identities.get(client_id)
        if found is None:
            found = ClientIdentity(client_id, self.private_key(client_id), self.roster)
            self._identities[client_id] = found
        return found

    __call__ = identity  # an identity source for ClientRuntime

    def __getstate__(self) -> dict[str, Any]:
        return {"secret": self._secret}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["secret"])  # type: ignore[misc]

    def __repr__(self) -> str:  # never the secret
        return "DerivedIdentities(<secret>)"


class _DerivedRoster(Mapping[int, bytes]):
    """Every non-negative id has a key (the population is whatever the run samples)."""

    def __init__(self, owner: DerivedIdentities) -> None:
        self._owner = owner

    def __getitem__(self, cid: int) -> bytes:
        if isinstance(cid, bool) or not isinstance(cid, int) or not 0 <= cid < MAX_CLIENT_ID:
            raise KeyError(cid)
        return self._owner.public_key(cid)

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, int) and not isinstance(cid, bool) and 0 <= cid < MAX_CLIENT_ID

    def __iter__(self) -> Iterator[int]:
        return iter(range(MAX_CLIENT_ID))

    def __len__(self) -> int:
        return MAX_CLIENT_ID
