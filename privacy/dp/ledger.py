"""Append-only, hash-chained JSONL privacy ledger.

Each line is the canonical JSON of one entry. `hash` is SHA-256 over the canonical
JSON of the entry without `hash` (so it covers `prev_hash`), and `prev_hash` is the
previous entry's `hash` (GENESIS_HASH for the first): editing, dropping or
reordering any line breaks the chain from that line on.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

GENESIS_HASH = "0" * 64

ENTRY_FIELDS = (
    "round",
    "mechanism",
    "noise_multiplier",
    "clip_norm",
    "sampling_rate",
    "sampling",
    "neighbouring",
    "privacy_unit",
    "cohort_planned",
    "cohort_aggregated",
    "delta",
    "epsilon",
    "accountant",
    "budget_epsilon",
    "timestamp",
    "prev_hash",
    "hash",
)


class LedgerCorruptError(ValueError):
    """The ledger file is not a valid chain (partial last line, bad hash, ...)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


def canonical_json(data: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace, ASCII only, no NaN: one byte string per value."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of `entry` minus its own `hash` field."""
    body = {key: value for key, value in entry.items() if key != "hash"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


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


class Ledger:
    """Single-writer, append-only ledger at `path` (a second writer is detected).

    Opening validates the whole existing chain; a partial last line (crash during
    an append) raises LedgerCorruptError rather than being dropped silently. After
    inspecting it, an operator may call `Ledger.discard_partial_tail(path)`: such a
    line was never acknowledged, so its release never happened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: list[dict[str, Any]] = []
        self._size = 0  # bytes this writer has seen: detects a second writer
        if self.path.exists():
            data = self.path.read_bytes()
            self._entries = _load_valid_chain(data)
            self._size = len(data)

    @property
    def entries(self) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self._entries]

    @property
    def head_hash(self) -> str:
        """Hash of the last entry (anchor for truncation checks), GENESIS_HASH if empty."""
        return self._entries[-1]["hash"] if self._entries else GENESIS_HASH

    @property
    def last_round(self) -> int:
        return int(self._entries[-1]["round"]) if self._entries else 0

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Append one entry; returns it only after the bytes are fsync'd to disk.

        `fields` holds every ENTRY_FIELDS key except prev_hash/hash (and optionally
        timestamp); rounds must be contiguous starting at 1.
        """
        entry = dict(fields)
        entry.setdefault("timestamp", _utc_now())
        entry["prev_hash"] = self.head_hash
        entry.pop("hash", None)
        missing = [name for name in ENTRY_FIELDS if name not in entry and name != "hash"]
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
        entry["hash"] = entry_hash(entry)
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
    for number, entry in enumerate(entries, start=1):
        check_chain_link(entry, prev_hash, number)
        if entry.get("round") != number:
            raise LedgerCorruptError(f"round {entry.get('round')!r}; expected {number}", number)
        prev_hash = entry["hash"]
    return entries


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
