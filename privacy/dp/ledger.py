"""Append-only, hash-chained, signed JSONL privacy ledger.

Each line is the canonical JSON of one entry. `hash` is SHA-256 over the canonical
JSON of the entry without `hash` and `signature` (so it covers `prev_hash`, `run_id`,
`seq` and `key_id`), and `prev_hash` is the previous entry's `hash` (GENESIS_HASH
for the first): editing, dropping or reordering any line breaks the chain from
that line on. With a signer, `signature` is the hex Ed25519 signature of
SIGNATURE_CONTEXT + the ASCII hex `hash`, and `key_id` names the key
(signing.key_id_for): re-hashing an edited chain then needs the private key.

Entries have a `kind`: "open" (schema 3: the run's signed opening record, always
seq 1, written before round 1: the plan, the cohort commitment where there is one,
and the ledger's Ed25519 `public_key`), "release" (one accounted release; `round`
counts releases 1, 2, ...), "interrupted" (the run stopped; a resume appends releases after it) or
"final" (the run ended; nothing may follow). `seq` numbers all entries 1, 2, ...
and every entry carries the run's `run_id`. A run that ends without a final or
interruption record reads as truncated.

Only public fields go here (an outside auditor reads them): per-round cohort
counts reveal who took part and belong in the operator's private annex. Old
ledgers that carry `cohort_planned`/`cohort_aggregated` are still read.

Every entry names its `schema` (LEDGER_SCHEMA). Schema 2 (fedveil.dp.ledger/2):
under distributed DP, release entries and closing records state
`epsilon_coordinator_bound` (a client in every release so far: the ledger's own
parameters give it) and never the realised `epsilon_coordinator_max`, which counts
how often the busiest client took part. Entries without `schema` are schema 1
(fedveil.dp.ledger/1), which recorded that realised figure.

Schema 3 (fedveil.dp.ledger/3) adds the opening record: a schema-3 ledger starts
with it, and every later entry names it (`opening`, the opening record's hash), so a
device shown any signed entry can check that it belongs to the run whose key it
pinned (ledger_head.py). Schema-2 ledgers (no opening record) still read and verify
as schema 2.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedveil.protocol.fields import LEDGER_HEAD

from .public_time import PublicClock

if TYPE_CHECKING:
    from .signing import LedgerSigner

GENESIS_HASH = "0" * 64
LEDGER_SCHEMA = "fedveil.dp.ledger/3"
SCHEMA_2 = "fedveil.dp.ledger/2"  # no opening record
LEGACY_SCHEMA = "fedveil.dp.ledger/1"  # entries without a `schema` field
SIGNATURE_CONTEXT = b"fedveil.ledger.entry.v1:"

OPEN = "open"
RELEASE = "release"
INTERRUPTED = "interrupted"
FINAL = "final"
CLOSE_KINDS = (INTERRUPTED, FINAL)
KINDS = (OPEN, RELEASE, *CLOSE_KINDS)
# The closing record's hash of the model file the run publishes (absent: not bound).
MODEL_SHA256 = "model_sha256"

# Public fields every release entry has (the ledger adds run_id..signature).
ENTRY_FIELDS = (
    "round",
    "mechanism",
    "noise_multiplier",
    "clip_norm",
    "sampling_rate",
    "sampling",
    "neighbouring",
    "privacy_unit",
    "delta",
    "epsilon",
    "accountant",
    "budget_epsilon",
    "timestamp",
    "prev_hash",
    "hash",
)
# Fields the ledger itself writes on every entry (signature fields only when signed).
RECORD_FIELDS = ("run_id", "kind", "seq", "schema", "timestamp", "prev_hash", "hash")
SIGNATURE_FIELDS = ("key_id", "signature")
OPENING_FIELD = "opening"  # schema 3: every entry after the opening names its hash
_RESERVED = frozenset(
    {*RECORD_FIELDS, *SIGNATURE_FIELDS, "round", "releases", OPENING_FIELD, "public_key"}
)
WITNESS_FIELDS = ("run_id", "seq", "hash", "key_id", "signature")
# The request config entry that carries the head to devices (ledger_head.head_message:
# the opening record and the last entry); devices keep its witness_head() fields.
WITNESS_CONFIG_KEY = LEDGER_HEAD


class LedgerCorruptError(ValueError):
    """The ledger file is not a valid chain (partial last line, bad hash, ...)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


class LedgerRunMismatchError(ValueError):
    """The ledger file belongs to another run (run id or signing key differ)."""


class LedgerClosedError(ValueError):
    """The run's final record is written: nothing may be appended after it."""


def canonical_json(data: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace, ASCII only, no NaN: one byte string per value."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def is_sha256_hex(value: Any) -> bool:
    """Whether `value` is a SHA-256 digest as the ledger writes it: 64 lowercase hex."""
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of `entry` minus its `hash` and `signature`."""
    body = {key: value for key, value in entry.items() if key not in ("hash", "signature")}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def signed_message(hash_hex: str) -> bytes:
    """The bytes an entry's signature covers: a context string, then its hash."""
    return SIGNATURE_CONTEXT + hash_hex.encode("ascii")


def entry_schema(entry: Mapping[str, Any]) -> Any:
    """An entry's ledger schema; entries from before the field existed are schema 1."""
    return entry.get("schema", LEGACY_SCHEMA)


def entry_kind(entry: Mapping[str, Any]) -> Any:
    """An entry's kind; old ledgers' entries (no `kind`) are all releases."""
    return entry.get("kind", RELEASE)


def parse_ledger_bytes(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """Complete lines parsed as JSON objects, plus the unterminated tail (b"" if none).

    Raises LedgerCorruptError for a complete line that is not a JSON object.
    """
    *lines, tail = data.split(b"\n")
    entries = []
    for number, raw in enumerate(lines, start=1):
        try:
            entry = json.loads(raw.decode("ascii"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise LedgerCorruptError(f"not valid JSON ({error})", number) from None
        if not isinstance(entry, dict):
            raise LedgerCorruptError("not a JSON object", number)
        entries.append(entry)
    return entries, tail


def check_chain_link(entry: Mapping[str, Any], prev_hash: str, line: int) -> None:
    """Raise LedgerCorruptError unless `entry` hashes correctly and follows `prev_hash`."""
    if entry.get("prev_hash") != prev_hash:
        raise LedgerCorruptError(
            f"prev_hash {entry.get('prev_hash')!r} does not match the previous entry's hash "
            f"{prev_hash!r} (entries removed, inserted or reordered)",
            line,
        )
    if entry.get("hash") != entry_hash(entry):
        raise LedgerCorruptError("hash does not match the entry's content (entry edited)", line)


def check_sequence(
    entry: Mapping[str, Any], line: int, releases_before: int, previous: Mapping[str, Any] | None
) -> None:
    """Raise LedgerCorruptError unless `entry` may follow `previous` at position `line`.

    `releases_before` counts the release entries before this one.
    """
    kind = entry_kind(entry)
    if kind not in KINDS:
        raise LedgerCorruptError(f"kind={kind!r} is invalid; allowed: {KINDS}", line)
    if "seq" in entry and entry["seq"] != line:
        raise LedgerCorruptError(f"seq {entry['seq']!r}; expected {line}", line)
    if kind == OPEN and line != 1:
        raise LedgerCorruptError("an opening record after the first line", line)
    if previous is not None and entry_kind(previous) == FINAL:
        raise LedgerCorruptError("an entry follows the run's final record", line)
    if previous is not None and previous.get("run_id") != entry.get("run_id"):
        raise LedgerCorruptError(
            f"run_id {entry.get('run_id')!r} differs from the previous entry's "
            f"{previous.get('run_id')!r}",
            line,
        )
    if kind == RELEASE and entry.get("round") != releases_before + 1:
        raise LedgerCorruptError(
            f"round {entry.get('round')!r}; expected {releases_before + 1} "
            "(rounds count releases: contiguous from 1)",
            line,
        )
    if kind != RELEASE and entry.get("releases") != releases_before:
        raise LedgerCorruptError(
            f"{kind} record says releases={entry.get('releases')!r}; the ledger has "
            f"{releases_before} before it",
            line,
        )


class Ledger:
    """Single-writer, append-only ledger at `path` (a second writer is detected).

    `run_id` binds every entry to the run (None: adopt the file's, or draw one at
    the first append); opening a file written under another run id raises
    LedgerRunMismatchError. `signer` signs each entry (no signer: entries are
    unsigned and `fedveil privacy verify` rejects them).

    Opening validates the whole existing chain; a partial last line (crash during
    an append) raises LedgerCorruptError rather than being dropped silently. After
    inspecting it, an operator may call `Ledger.discard_partial_tail(path)`: such a
    line was never acknowledged, so its release never happened.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        signer: LedgerSigner | None = None,
    ) -> None:
        self.path = Path(path)
        self.signer = signer
        # A public DP ledger stamps every entry with the hour this writer opened in: no
        # two timestamps measure a round's duration (public_time.py).
        self._clock = PublicClock(dp=True)
        self._entries: list[dict[str, Any]] = []
        self._size = 0  # bytes this writer has seen: detects a second writer
        if self.path.exists():
            data = self.path.read_bytes()
            self._entries = _load_valid_chain(data)
            self._size = len(data)
        self.run_id = self._bind_run_id(run_id)
        self._check_signer_matches()

    def _bind_run_id(self, run_id: str | None) -> str | None:
        if not self._entries:
            return run_id
        recorded = self._entries[0].get("run_id")
        if run_id is not None and recorded != run_id:
            raise LedgerRunMismatchError(
                f"{self.path}: ledger belongs to run_id={recorded!r}, not run_id={run_id!r}; "
                "one ledger per run"
            )
        return recorded if isinstance(recorded, str) else None

    def _check_signer_matches(self) -> None:
        if self.signer is None or not self._entries:
            return
        recorded = self._entries[-1].get("key_id")
        if recorded is not None and recorded != self.signer.key_id:
            raise LedgerRunMismatchError(
                f"{self.path}: ledger is signed by key_id={recorded!r} but this signer is "
                f"key_id={self.signer.key_id!r}; resume with the run's own key"
            )

    @property
    def entries(self) -> list[dict[str, Any]]:
        """Every entry: releases and the interruption/final records."""
        return [dict(entry) for entry in self._entries]

    @property
    def releases(self) -> list[dict[str, Any]]:
        """The release entries only (what the accountant composes)."""
        return [dict(entry) for entry in self._entries if entry_kind(entry) == RELEASE]

    @property
    def head_hash(self) -> str:
        """Hash of the last entry (anchor for truncation checks), GENESIS_HASH if empty."""
        return self._entries[-1]["hash"] if self._entries else GENESIS_HASH

    @property
    def last_round(self) -> int:
        """The number of releases so far (= the last release's `round`)."""
        for entry in reversed(self._entries):
            if entry_kind(entry) == RELEASE:
                return int(entry["round"])
        return 0

    @property
    def closed(self) -> bool:
        """True once the final record is written."""
        return bool(self._entries) and entry_kind(self._entries[-1]) == FINAL

    @property
    def last_kind(self) -> str | None:
        return entry_kind(self._entries[-1]) if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def opening(self) -> dict[str, Any] | None:
        """The run's opening record (schema 3), None for an empty or schema-2 ledger."""
        if self._entries and entry_kind(self._entries[0]) == OPEN:
            return dict(self._entries[0])
        return None

    @property
    def last_entry(self) -> dict[str, Any] | None:
        """The last entry (a copy), None for an empty ledger."""
        return dict(self._entries[-1]) if self._entries else None

    def open(self, fields: Mapping[str, Any]) -> dict[str, Any] | None:
        """Write the run's signed opening record (before round 1; needs a signer).

        `fields` holds `plan` (the run's public privacy plan) and optionally
        `cohort_commitment`; the ledger adds `public_key` (hex, its Ed25519 key), so a
        device can pin the key and verify every head it is shown. An existing ledger
        (a resume) is left as it is: returns its opening record, or None for a
        schema-2 ledger, which has none and cannot get one (its chain is fixed).
        """
        if self._entries:
            return self.opening
        if self.signer is None:
            raise ValueError(f"{self.path}: an opening record must be signed (no signer given)")
        reserved = sorted(_RESERVED & set(fields))
        if reserved:
            raise ValueError(f"opening fields {reserved} are written by the ledger itself")
        if not isinstance(fields.get("plan"), Mapping):
            raise ValueError(f"opening field plan={fields.get('plan')!r}: expected a mapping")
        entry = dict(fields)
        entry["public_key"] = self.signer.public_key_bytes.hex()
        entry["releases"] = 0
        return self._append(OPEN, entry)

    def witness_head(self) -> dict[str, Any]:
        """{run_id, seq, hash, key_id, signature} of the last entry: what devices keep."""
        if not self._entries:
            raise ValueError(f"{self.path}: empty ledger has no head to witness")
        last = self._entries[-1]
        return {
            "run_id": last.get("run_id"),
            "seq": last.get("seq", len(self._entries)),
            "hash": last["hash"],
            "key_id": last.get("key_id"),
            "signature": last.get("signature"),
        }

    def record(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Append one release entry; returns it only after the bytes are fsync'd to disk.

        `fields` holds every ENTRY_FIELDS key except prev_hash/hash (and optionally
        timestamp); rounds must be contiguous starting at 1.
        """
        entry = {k: v for k, v in fields.items() if k not in (*RECORD_FIELDS, *SIGNATURE_FIELDS)}
        if "timestamp" in fields:
            entry["timestamp"] = fields["timestamp"]
        missing = [name for name in ENTRY_FIELDS if name not in (*RECORD_FIELDS, *entry)]
        if missing:
            raise ValueError(f"ledger entry lacks fields {missing}")
        expected_round = self.last_round + 1
        if entry["round"] != expected_round:
            raise ValueError(
                f"ledger entry round={entry['round']!r}; expected {expected_round} "
                "(rounds are contiguous; retry a failed round under its number)"
            )
        if not (isinstance(entry["epsilon"], (int, float)) and math.isfinite(entry["epsilon"])):
            raise ValueError(f"ledger entry epsilon={entry['epsilon']!r} must be finite")
        return self._append(RELEASE, entry)

    def close(self, kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Append the run's "interrupted" or "final" record (durably, signed).

        `fields` must hold `training_round` (an integer >= 0); a final record also
        `epsilon` (the run's final figure), an interruption record e.g. `reason`.
        `model_sha256`, where given, is the hex SHA-256 of the model file the run
        publishes as of this record (the caller hashes it: the ledger knows no run
        directory); it binds that file to the signed record.
        After "final" nothing more may be appended; after "interrupted" a resumed
        run appends releases again.
        """
        if kind not in CLOSE_KINDS:
            raise ValueError(f"close kind={kind!r} is invalid; allowed: {CLOSE_KINDS}")
        reserved = sorted(_RESERVED & set(fields))
        if reserved:
            raise ValueError(f"close fields {reserved} are written by the ledger itself")
        training_round = fields.get("training_round")
        if not (
            isinstance(training_round, int)
            and not isinstance(training_round, bool)
            and training_round >= 0
        ):
            raise ValueError(
                f"close field training_round={training_round!r} is invalid; "
                "allowed: an integer >= 0"
            )
        if kind == FINAL:
            epsilon = fields.get("epsilon")
            if not (
                isinstance(epsilon, (int, float))
                and not isinstance(epsilon, bool)
                and math.isfinite(epsilon)
                and epsilon >= 0
            ):
                raise ValueError(
                    f"final record epsilon={epsilon!r} is invalid; allowed: a finite number >= 0"
                )
        if MODEL_SHA256 in fields and not is_sha256_hex(fields[MODEL_SHA256]):
            raise ValueError(
                f"close field {MODEL_SHA256}={fields[MODEL_SHA256]!r} is invalid; allowed: "
                "64 lowercase hex digits (a SHA-256)"
            )
        entry = dict(fields)
        entry["releases"] = self.last_round
        return self._append(kind, entry)

    def _append(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.closed:
            raise LedgerClosedError(
                f"{self.path}: the run's final record is written; nothing may follow it"
            )
        if self.run_id is None:
            self.run_id = secrets.token_hex(16)
        entry = dict(body)
        entry.setdefault("timestamp", self._clock.iso())
        entry["run_id"] = self.run_id
        entry["kind"] = kind
        entry["seq"] = len(self._entries) + 1
        # A schema-2 ledger resumed stays schema 2: schema 3 needs an opening at seq 1.
        schema_3 = kind == OPEN or self.opening is not None
        entry["schema"] = LEDGER_SCHEMA if schema_3 else SCHEMA_2
        entry["prev_hash"] = self.head_hash
        opening = self.opening
        if opening is not None:
            entry[OPENING_FIELD] = opening["hash"]
        if self.signer is not None:
            entry["key_id"] = self.signer.key_id
        entry["hash"] = entry_hash(entry)
        if self.signer is not None:
            entry["signature"] = self.signer.sign(signed_message(entry["hash"])).hex()
        self._append_durably((canonical_json(entry) + "\n").encode("ascii"))
        self._entries.append(entry)
        return dict(entry)

    def _append_durably(self, line: bytes) -> None:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # Advisory lock + size check: a second writer would fork the chain, so
            # refuse to append if the file is not exactly what this writer last saw.
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size != self._size:
                raise LedgerCorruptError(
                    f"ledger file is {size} bytes but this writer wrote "
                    f"{self._size}: another writer or an edit; reopen it"
                )
            written = 0
            while written < len(line):
                written += os.write(fd, line[written:])
            os.fsync(fd)
            self._size += len(line)
        finally:
            os.close(fd)  # also releases the lock
        if created:
            # A new file's directory entry is only durable once the directory is synced.
            _fsync_directory(self.path.parent)

    @staticmethod
    def discard_partial_tail(path: str | os.PathLike[str]) -> bytes:
        """Truncate an unterminated last line left by a crash; returns the removed bytes."""
        path = Path(path)
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        tail = data[cut:]
        if tail:
            with open(path, "r+b") as handle:
                handle.truncate(cut)
                handle.flush()
                os.fsync(handle.fileno())
        return tail


def _load_valid_chain(data: bytes) -> list[dict[str, Any]]:
    entries, tail = parse_ledger_bytes(data)
    if tail:
        raise LedgerCorruptError(
            f"partial last line ({len(tail)} bytes after the last newline): an append was "
            "interrupted; inspect it, then Ledger.discard_partial_tail(path)",
            len(entries) + 1,
        )
    prev_hash = GENESIS_HASH
    releases = 0
    previous: dict[str, Any] | None = None
    for number, entry in enumerate(entries, start=1):
        check_chain_link(entry, prev_hash, number)
        check_sequence(entry, number, releases, previous)
        releases += entry_kind(entry) == RELEASE
        prev_hash = entry["hash"]
        previous = entry
    return entries


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
