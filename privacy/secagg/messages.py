"""Typed protocol messages, one dataclass per stage and direction, with a strict wire codec.

`to_wire()` returns `(config, arrays)`: small values for a config record, big vectors for an
array record. `from_wire(config, arrays)` checks every key, type, length, dtype and shape and
the message/stage tags, and raises only `SecAggProtocolError` naming the field and the check.
Session ids and membership are checked by the receiving party, which knows the session.

Every message carries `session_id` and `client_id`: the sender for client → server messages,
the recipient for server → client requests.

    stage          server → client            client → server
    advertise      AdvertiseRequest           AdvertiseKeys
    share_keys     ShareKeysRequest           ShareKeys
    masked_input   MaskedInputRequest         MaskedInput
    consistency    ConsistencyRequest         ConsistencySignature   (malicious mode only)
    unmask         UnmaskRequest              UnmaskShares
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from fedveil.protocol.kinds import Stage  # the stage names on the wire, defined once

from .crypto import KEY_BYTES, NONCE_BYTES, SIGNATURE_BYTES, TAG_BYTES
from .errors import SecAggProtocolError
from .session import SESSION_ID_MAX, SESSION_ID_MIN, SessionConfig
from .shamir import SHARE_BYTES
from .view import VIEW_ARRAYS, SessionView
from .wire import Arrays, Bytes, BytesList, Config, Int, IntList, Str, Vector, fail

SHARE_PLAINTEXT_BYTES = 2 * SHARE_BYTES
SHARE_CIPHERTEXT_BYTES = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + TAG_BYTES


_HEADER = {
    "session_id": Bytes(SESSION_ID_MIN, SESSION_ID_MAX),
    "client_id": Int(),
}
_KEY = Bytes(KEY_BYTES, KEY_BYTES)
_KEYS = BytesList(KEY_BYTES, KEY_BYTES)
_SIGNATURE = Bytes(0, SIGNATURE_BYTES)  # empty in semi-honest mode
_SIGNATURES = BytesList(0, SIGNATURE_BYTES)
_CIPHERTEXTS = BytesList(SHARE_CIPHERTEXT_BYTES, SHARE_CIPHERTEXT_BYTES)
_SHARES = BytesList(SHARE_BYTES, SHARE_BYTES)
_BITMAP = Bytes(1, 1 << 22)

M = TypeVar("M", bound="Message")


@dataclass(frozen=True)
class Message:
    """Common header and the declarative codec; subclasses list their fields in FIELDS."""

    KIND: ClassVar[str] = ""
    STAGE: ClassVar[Stage]
    FIELDS: ClassVar[dict[str, Any]] = {}

    session_id: bytes
    client_id: int

    def to_wire(self) -> tuple[Config, Arrays]:
        config: Config = {"msg": self.KIND, "stage": self.STAGE.value}
        arrays: Arrays = {}
        for name, spec in {**_HEADER, **self.FIELDS}.items():
            value = spec.encode(getattr(self, name))
            if spec.in_arrays:
                arrays[name] = value
            else:
                config[name] = value
        return config, arrays

    @classmethod
    def from_wire(cls: type[M], config: Mapping[str, Any], arrays: Mapping[str, Any]) -> M:
        values = _decode(cls.KIND, cls.STAGE, {**_HEADER, **cls.FIELDS}, config, arrays)
        message = cls(**values)
        message.check()
        return message._mark_decoded()

    def check(self) -> None:
        """Cross-field checks; raise SecAggProtocolError."""

    def validated(self: M) -> M:
        """This message if it came out of `from_wire`, else a round trip through the decoder.

        Parties call this on everything they receive, so hand-built or altered messages (e.g.
        `dataclasses.replace` of a decoded one) get exactly the checks of the wire path.
        """
        if self.__dict__.get("_decoded", False):
            return self
        try:
            return type(self).from_wire(*self.to_wire())
        except SecAggProtocolError:
            raise
        except Exception as exc:  # a hand-built message with ill-typed fields
            raise fail(self.KIND, f"malformed message ({type(exc).__name__}: {exc})") from None

    def _mark_decoded(self: M) -> M:
        # Frozen dataclass: the flag lives in the instance dict, outside the fields, so
        # `dataclasses.replace` (a new instance) never inherits it.
        object.__setattr__(self, "_decoded", True)
        return self


def _decode(
    kind: str,
    stage: Stage,
    specs: dict[str, Any],
    config: Mapping[str, Any],
    arrays: Mapping[str, Any],
) -> dict[str, Any]:
    if not isinstance(config, Mapping) or not isinstance(arrays, Mapping):
        raise fail(kind, "config and arrays must be mappings")
    config_keys = {"msg", "stage"} | {n for n, s in specs.items() if not s.in_arrays}
    array_keys = {n for n, s in specs.items() if s.in_arrays}
    for key in config:
        if key not in config_keys:
            raise fail(kind, f"unexpected config key {str(key)[:40]!r}")
    for key in arrays:
        if key not in array_keys:
            raise fail(kind, f"unexpected array key {str(key)[:40]!r}")
    Str((kind,)).decode(f"{kind}.msg", config.get("msg"))
    Str((stage.value,)).decode(f"{kind}.stage", config.get("stage"))
    values = {}
    for name, spec in specs.items():
        source = arrays if spec.in_arrays else config
        if name not in source:
            raise fail(f"{kind}.{name}", "missing")
        values[name] = spec.decode(f"{kind}.{name}", source[name])
    return values


def _same_length(kind: str, **columns: tuple[Any, ...]) -> None:
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise fail(kind, f"parallel lists differ in length: {lengths}")


def _signature_sizes(path: str, signatures: tuple[bytes, ...]) -> None:
    for i, sig in enumerate(signatures):
        if len(sig) not in (0, SIGNATURE_BYTES):
            raise fail(f"{path}[{i}]", f"signature must be empty or {SIGNATURE_BYTES} bytes")


# --- advertise ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvertiseRequest(Message):
    """Server → client: the session to join (under `session.*` keys). Malicious mode: the
    full SessionConfig; semi-honest mode: the recipient's SessionView (no cohort list)."""

    KIND: ClassVar[str] = "advertise_request"
    STAGE: ClassVar[Stage] = Stage.ADVERTISE

    session: SessionConfig | SessionView

    def to_wire(self) -> tuple[Config, Arrays]:
        config, arrays = super().to_wire()
        session_config, session_arrays = self.session.to_wire()
        config.update({f"session.{k}": v for k, v in session_config.items()})
        arrays.update({f"session.{k}": v for k, v in session_arrays.items()})
        return config, arrays

    @classmethod
    def from_wire(cls, config: Mapping[str, Any], arrays: Mapping[str, Any]) -> AdvertiseRequest:
        if not isinstance(config, Mapping) or not isinstance(arrays, Mapping):
            raise fail(cls.KIND, "config and arrays must be mappings")
        own = {k: v for k, v in config.items() if not str(k).startswith("session.")}
        own_arrays = {k: v for k, v in arrays.items() if not str(k).startswith("session.")}
        values = _decode(cls.KIND, cls.STAGE, _HEADER, own, own_arrays)
        nested = {str(k)[8:]: v for k, v in config.items() if str(k).startswith("session.")}
        nested_arrays = {str(k)[8:]: v for k, v in arrays.items() if str(k).startswith("session.")}
        kind: type[SessionConfig] | type[SessionView]
        if set(nested_arrays) == {"client_ids"}:
            kind, arrays_fields = SessionConfig, {"client_ids"}
            expected = set(SessionConfig.__dataclass_fields__) - arrays_fields | {"protocol"}
        elif set(nested_arrays) == VIEW_ARRAYS:
            kind = SessionView
            expected = set(SessionView.__dataclass_fields__) - VIEW_ARRAYS | {"protocol"}
        else:
            raise fail(
                f"{cls.KIND}.session",
                f"arrays must hold client_ids or exactly {sorted(VIEW_ARRAYS)}",
            )
        for key in nested:
            if key not in expected:
                raise fail(f"{cls.KIND}.session", f"unexpected key {key[:40]!r}")
        session = kind.from_wire(nested, nested_arrays, f"{cls.KIND}.session")
        message = cls(session=session, **values)
        message.check()
        return message._mark_decoded()

    def check(self) -> None:
        if self.session.session_id != self.session_id:
            raise fail(f"{self.KIND}.session_id", "differs from the session config's id")
        if not self.session.contains(self.client_id):
            raise fail(f"{self.KIND}.client_id", "recipient is not in the cohort")
        if isinstance(self.session, SessionView) and self.session.holder != self.client_id:
            raise fail(f"{self.KIND}.session.holder", "the view is another client's")


@dataclass(frozen=True)
class AdvertiseKeys(Message):
    """Client → server: the round's public keys and the seed commitment (signed if malicious)."""

    KIND: ClassVar[str] = "advertise_keys"
    STAGE: ClassVar[Stage] = Stage.ADVERTISE
    FIELDS: ClassVar[dict[str, Any]] = {
        "mask_public_key": _KEY,
        "encryption_public_key": _KEY,
        "seed_commitment": _KEY,
        "signature": _SIGNATURE,
    }

    mask_public_key: bytes
    encryption_public_key: bytes
    seed_commitment: bytes
    signature: bytes

    def check(self) -> None:
        _signature_sizes(f"{self.KIND}.signature", (self.signature,))
        if self.mask_public_key == self.encryption_public_key:
            raise fail(self.KIND, "mask and encryption public keys must differ")


# --- share keys -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShareKeysRequest(Message):
    """Server → client: the advertisements of the client's neighbours that advertised."""

    KIND: ClassVar[str] = "share_keys_request"
    STAGE: ClassVar[Stage] = Stage.SHARE_KEYS
    FIELDS: ClassVar[dict[str, Any]] = {
        "peer_ids": IntList(),
        "mask_public_keys": _KEYS,
        "encryption_public_keys": _KEYS,
        "seed_commitments": _KEYS,
        "signatures": _SIGNATURES,
    }

    peer_ids: tuple[int, ...]
    mask_public_keys: tuple[bytes, ...]
    encryption_public_keys: tuple[bytes, ...]
    seed_commitments: tuple[bytes, ...]
    signatures: tuple[bytes, ...]

    def check(self) -> None:
        _same_length(
            self.KIND,
            peer_ids=self.peer_ids,
            mask_public_keys=self.mask_public_keys,
            encryption_public_keys=self.encryption_public_keys,
            seed_commitments=self.seed_commitments,
            signatures=self.signatures,
        )
        _signature_sizes(f"{self.KIND}.signatures", self.signatures)
        if self.client_id in self.peer_ids:
            raise fail(f"{self.KIND}.peer_ids", "contains the recipient itself")


@dataclass(frozen=True)
class ShareKeys(Message):
    """Client → server: one encrypted (seed share, mask-key share) pair per neighbour."""

    KIND: ClassVar[str] = "share_keys"
    STAGE: ClassVar[Stage] = Stage.SHARE_KEYS
    FIELDS: ClassVar[dict[str, Any]] = {"recipient_ids": IntList(), "ciphertexts": _CIPHERTEXTS}

    recipient_ids: tuple[int, ...]
    ciphertexts: tuple[bytes, ...]

    def check(self) -> None:
        _same_length(self.KIND, recipient_ids=self.recipient_ids, ciphertexts=self.ciphertexts)
        if self.client_id in self.recipient_ids:
            raise fail(f"{self.KIND}.recipient_ids", "contains the sender itself")


# --- masked input ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskedInputRequest(Message):
    """Server → client: the share ciphertexts addressed to this client."""

    KIND: ClassVar[str] = "masked_input_request"
    STAGE: ClassVar[Stage] = Stage.MASKED_INPUT
    FIELDS: ClassVar[dict[str, Any]] = {"sender_ids": IntList(), "ciphertexts": _CIPHERTEXTS}

    sender_ids: tuple[int, ...]
    ciphertexts: tuple[bytes, ...]

    def check(self) -> None:
        _same_length(self.KIND, sender_ids=self.sender_ids, ciphertexts=self.ciphertexts)
        if self.client_id in self.sender_ids:
            raise fail(f"{self.KIND}.sender_ids", "contains the recipient itself")


@dataclass(frozen=True)
class MaskedInput(Message):
    """Client → server: the masked vector, and the senders whose share ciphertext was invalid."""

    KIND: ClassVar[str] = "masked_input"
    STAGE: ClassVar[Stage] = Stage.MASKED_INPUT
    FIELDS: ClassVar[dict[str, Any]] = {
        "invalid_share_senders": IntList(),
        "masked_vector": Vector(),
    }

    invalid_share_senders: tuple[int, ...]
    masked_vector: np.ndarray


# --- consistency (malicious mode) -----------------------------------------------------------


@dataclass(frozen=True)
class ConsistencyRequest(Message):
    """Server → client: the survivor set U3 (bitmap over the sorted cohort) to sign."""

    KIND: ClassVar[str] = "consistency_request"
    STAGE: ClassVar[Stage] = Stage.CONSISTENCY
    FIELDS: ClassVar[dict[str, Any]] = {"survivors": _BITMAP}

    survivors: bytes


@dataclass(frozen=True)
class ConsistencySignature(Message):
    """Client → server: the client's Ed25519 signature on (session, U3)."""

    KIND: ClassVar[str] = "consistency_signature"
    STAGE: ClassVar[Stage] = Stage.CONSISTENCY
    FIELDS: ClassVar[dict[str, Any]] = {"signature": Bytes(SIGNATURE_BYTES, SIGNATURE_BYTES)}

    signature: bytes


# --- unmask ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnmaskRequest(Message):
    """Server → client: how many survived (|U3|) and which: malicious mode, U3 as a bitmap
    over the cohort with the neighbours' signatures on it; semi-honest mode, one bit per
    member of the recipient's neighbourhood (SessionView.ids_array order)."""

    KIND: ClassVar[str] = "unmask_request"
    STAGE: ClassVar[Stage] = Stage.UNMASK
    FIELDS: ClassVar[dict[str, Any]] = {
        "survivor_count": Int(0, 1 << 32),
        "survivors": _BITMAP,
        "signer_ids": IntList(),
        "signatures": BytesList(SIGNATURE_BYTES, SIGNATURE_BYTES),
    }

    survivor_count: int
    survivors: bytes
    signer_ids: tuple[int, ...]
    signatures: tuple[bytes, ...]

    def check(self) -> None:
        _same_length(self.KIND, signer_ids=self.signer_ids, signatures=self.signatures)


@dataclass(frozen=True)
class UnmaskShares(Message):
    """Client → server: seed shares of survivors, mask-key shares of dropped clients."""

    KIND: ClassVar[str] = "unmask_shares"
    STAGE: ClassVar[Stage] = Stage.UNMASK
    FIELDS: ClassVar[dict[str, Any]] = {
        "seed_owner_ids": IntList(),
        "seed_shares": _SHARES,
        "key_owner_ids": IntList(),
        "key_shares": _SHARES,
    }

    seed_owner_ids: tuple[int, ...]
    seed_shares: tuple[bytes, ...]
    key_owner_ids: tuple[int, ...]
    key_shares: tuple[bytes, ...]

    def check(self) -> None:
        _same_length(self.KIND, seed_owner_ids=self.seed_owner_ids, seed_shares=self.seed_shares)
        _same_length(self.KIND, key_owner_ids=self.key_owner_ids, key_shares=self.key_shares)
        both = set(self.seed_owner_ids) & set(self.key_owner_ids)
        if both:
            raise fail(self.KIND, f"reveals both share kinds for clients {sorted(both)[:5]}")


CLIENT_MESSAGES: dict[Stage, type[Message]] = {
    Stage.ADVERTISE: AdvertiseKeys,
    Stage.SHARE_KEYS: ShareKeys,
    Stage.MASKED_INPUT: MaskedInput,
    Stage.CONSISTENCY: ConsistencySignature,
    Stage.UNMASK: UnmaskShares,
}
SERVER_MESSAGES: dict[Stage, type[Message]] = {
    Stage.ADVERTISE: AdvertiseRequest,
    Stage.SHARE_KEYS: ShareKeysRequest,
    Stage.MASKED_INPUT: MaskedInputRequest,
    Stage.CONSISTENCY: ConsistencyRequest,
    Stage.UNMASK: UnmaskRequest,
}
ALL_MESSAGES: tuple[type[Message], ...] = (
    *SERVER_MESSAGES.values(),
    *CLIENT_MESSAGES.values(),
)
MESSAGE_TYPES: dict[str, type[Message]] = {cls.KIND: cls for cls in ALL_MESSAGES}


def decode_message(config: Mapping[str, Any], arrays: Mapping[str, Any]) -> Message:
    """Decode any protocol message, dispatching on its `msg` tag (for transports)."""
    kind = config.get("msg") if isinstance(config, Mapping) else None
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise fail("message.msg", f"unknown message type {str(kind)[:40]!r}")
    return MESSAGE_TYPES[kind].from_wire(config, arrays)
