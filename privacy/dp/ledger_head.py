"""The ledger head a DP request carries, and the checks a device makes on it.

Under DP every training request carries `ledger.head` (fields.LEDGER_HEAD): the JSON
of {"opening": the run's signed opening record, "entry": the ledger's last entry}.
Both are whole entries, so a device recomputes their hashes itself and needs no
one's word for what they contain:

- `pin_opening` checks an opening record on its own: kind "open", seq 1, the genesis
  link, its hash, the `key_id` of the `public_key` it carries and its signature under
  that key. The device pins the result (`LedgerPin`) for the run, on first sight.
- `check_head` checks a head against a pin: the same opening (hash), an entry that
  hashes to its `hash`, signed by the pinned key, of the pinned run, naming the
  pinned opening (`opening`, schema 3) unless it is the opening itself, and no
  rollback: its seq is not below the highest seq the device has seen, and at that
  seq its hash is the one seen (a second chain at the same length is a fork).

A head that passes is returned as a witness head (ledger.WITNESS_FIELDS), which the
device keeps and `fedveil privacy verify --witness` checks against the published chain.
Every failure is a `HeadRefused` naming the field, the value and what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .ledger import (
    GENESIS_HASH,
    OPEN,
    OPENING_FIELD,
    WITNESS_CONFIG_KEY,
    WITNESS_FIELDS,
    Ledger,
    entry_hash,
    entry_kind,
    signed_message,
)
from .signing import PUBLIC_KEY_BYTES, key_id_for, verify_signature

MAX_HEAD_CHARS = 64_000  # a head is two ledger entries: bounded before parsing


class HeadRefused(ValueError):
    """A ledger head this device does not accept (missing, forged, rolled back, rekeyed)."""


@dataclass(frozen=True)
class LedgerPin:
    """What a device pins for a run from its opening record."""

    run_id: str
    key_id: str
    public_key: bytes
    opening_hash: str
    opening: dict[str, Any]


def head_message(ledger: Ledger) -> dict[str, Any]:
    """The head to send with a request: the opening record and the last entry.

    Raises ValueError for a ledger without an opening record (schema 2, or not opened):
    a device could not verify its head, so nothing is sent that pretends otherwise.
    """
    opening = ledger.opening
    if opening is None:
        raise ValueError(
            f"{ledger.path}: the ledger has no opening record (schema 2, or not opened): "
            "devices cannot verify its head"
        )
    return {"opening": opening, "entry": ledger.last_entry}


def parse_head_message(text: object) -> dict[str, Any]:
    """The head as sent (a JSON string), checked for shape only."""
    if not isinstance(text, str):
        raise HeadRefused(f"{WITNESS_CONFIG_KEY}={text!r:.80}: expected a JSON string")
    if len(text) > MAX_HEAD_CHARS:
        raise HeadRefused(
            f"{WITNESS_CONFIG_KEY}: {len(text)} characters; allowed: at most {MAX_HEAD_CHARS}"
        )
    try:
        head = json.loads(text)
    except json.JSONDecodeError as error:
        raise HeadRefused(f"{WITNESS_CONFIG_KEY}: not valid JSON ({error})") from None
    if not isinstance(head, dict):
        raise HeadRefused(f"{WITNESS_CONFIG_KEY}: not a JSON object")
    for name in ("opening", "entry"):
        if not isinstance(head.get(name), dict):
            raise HeadRefused(
                f"{WITNESS_CONFIG_KEY}.{name}={head.get(name)!r:.80}: missing or not an "
                "object (a head names the run's opening record and the ledger's last entry)"
            )
    return head


def _check_hash_and_signature(entry: Mapping[str, Any], key: bytes, where: str) -> None:
    stated = entry.get("hash")
    if not (isinstance(stated, str) and stated == entry_hash(entry)):
        raise HeadRefused(f"{where}.hash={stated!r:.80} does not match the entry's content")
    signature = entry.get("signature")
    try:
        raw = bytes.fromhex(signature) if isinstance(signature, str) else b""
    except ValueError:
        raw = b""
    if not verify_signature(key, raw, signed_message(stated)):
        raise HeadRefused(
            f"{where}.signature does not verify under key_id {key_id_for(key)} "
            "(forged, or signed by another key)"
        )


def pin_opening(opening: Mapping[str, Any]) -> LedgerPin:
    """Check an opening record on its own; the pin it gives (module doc)."""
    where = f"{WITNESS_CONFIG_KEY}.opening"
    if entry_kind(opening) != OPEN or opening.get("seq") != 1:
        raise HeadRefused(
            f"{where}: kind={opening.get('kind')!r}, seq={opening.get('seq')!r}; expected "
            f"kind={OPEN!r}, seq=1 (the run's opening record)"
        )
    if opening.get("prev_hash") != GENESIS_HASH:
        raise HeadRefused(f"{where}.prev_hash={opening.get('prev_hash')!r:.80}: not the genesis")
    run_id = opening.get("run_id")
    if not (isinstance(run_id, str) and run_id):
        raise HeadRefused(f"{where}.run_id={run_id!r:.80}: expected a run id")
    try:
        key = bytes.fromhex(str(opening.get("public_key")))
    except ValueError:
        key = b""
    if len(key) != PUBLIC_KEY_BYTES:
        raise HeadRefused(
            f"{where}.public_key={opening.get('public_key')!r:.80}: expected "
            f"{PUBLIC_KEY_BYTES} bytes of hex (an Ed25519 public key)"
        )
    key_id = key_id_for(key)
    if opening.get("key_id") != key_id:
        raise HeadRefused(
            f"{where}.key_id={opening.get('key_id')!r:.80} is not the id of its public_key "
            f"({key_id})"
        )
    _check_hash_and_signature(opening, key, where)
    return LedgerPin(run_id, key_id, key, str(opening["hash"]), dict(opening))


def check_head(pin: LedgerPin, head: Mapping[str, Any], seen: Mapping[int, str]) -> dict[str, Any]:
    """Check a parsed head against `pin` and the heads already seen (seq -> hash).

    Returns the witness head (WITNESS_FIELDS) of its entry; raises HeadRefused.
    """
    opening = head["opening"]
    if opening.get("hash") != pin.opening_hash or opening.get("key_id") != pin.key_id:
        raise HeadRefused(
            f"{WITNESS_CONFIG_KEY}.opening: hash {opening.get('hash')!r:.80}, key_id "
            f"{opening.get('key_id')!r:.40}; this device pinned run {pin.run_id}'s opening "
            f"{pin.opening_hash} under key_id {pin.key_id} (the coordinator changed key or "
            "restarted the ledger within the run)"
        )
    entry = head["entry"]
    where = f"{WITNESS_CONFIG_KEY}.entry"
    if entry.get("key_id") != pin.key_id:
        raise HeadRefused(
            f"{where}.key_id={entry.get('key_id')!r:.80}; pinned key_id {pin.key_id} "
            "(the coordinator changed key)"
        )
    if entry.get("run_id") != pin.run_id:
        raise HeadRefused(f"{where}.run_id={entry.get('run_id')!r:.80}; pinned {pin.run_id}")
    _check_hash_and_signature(entry, pin.public_key, where)
    seq = entry.get("seq")
    if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1):
        raise HeadRefused(f"{where}.seq={seq!r:.80}: expected an integer >= 1")
    if seq == 1:
        if entry["hash"] != pin.opening_hash:
            raise HeadRefused(f"{where}: seq 1 is not the pinned opening record")
    elif entry.get(OPENING_FIELD) != pin.opening_hash:
        raise HeadRefused(
            f"{where}.{OPENING_FIELD}={entry.get(OPENING_FIELD)!r:.80}; expected the pinned "
            f"opening {pin.opening_hash} (an entry of another chain)"
        )
    highest = max(seen, default=0)
    if seq < highest:
        raise HeadRefused(
            f"{where}.seq={seq}: this device has seen run {pin.run_id}'s ledger at seq "
            f"{highest} (rolled back)"
        )
    if seq in seen and seen[seq] != entry["hash"]:
        raise HeadRefused(
            f"{where}: seq {seq} with hash {entry['hash']}, but this device saw {seen[seq]} "
            "at that seq (a forked chain)"
        )
    return {name: entry.get(name) for name in WITNESS_FIELDS}


def is_dp_run(cfg: Any) -> bool:
    """Whether a run config has a release mechanism or trains with DP-SGD: its ledger is
    opened before round 1 and every training request carries a head."""
    noise = cfg.client.dp_sgd_noise
    # A non-number counts as DP-SGD on (fail closed): NaN > 0 is False.
    return cfg.dp.mechanism != "none" or not (noise <= 0)
