"""Independent ledger verifier: chain, rounds, budget and recomputed epsilon.

Trusts nothing stored except the events themselves: epsilon is recomputed from
(q, z, steps, sampling, neighbouring) of every prefix and compared with the
recorded value. Stops at, and reports, the FIRST discrepancy in file order.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from .accounting import compute_epsilon
from .budget import event_from_entry
from .events import PrivacyEvent
from .ledger import (
    ENTRY_FIELDS,
    GENESIS_HASH,
    LedgerCorruptError,
    check_chain_link,
)

RUN_CONSTANT_FIELDS = (
    "mechanism",
    "privacy_unit",
    "sampling",
    "neighbouring",
    "delta",
    "accountant",
    "budget_epsilon",
)
_NUMERIC_FIELDS = (
    "noise_multiplier",
    "clip_norm",
    "sampling_rate",
    "delta",
    "epsilon",
    "budget_epsilon",
)
_INTEGER_FIELDS = ("round", "cohort_planned", "cohort_aggregated")

LedgerSource = str | os.PathLike[str] | bytes | BinaryIO | TextIO | Iterable[Mapping[str, Any]]


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    message: str
    line: int | None = None  # 1-based line (entry index) of the first discrepancy
    round: int | None = None
    entries: int = 0  # entries that passed every check
    epsilon_recomputed: int = 0  # how many prefixes had epsilon recomputed
    final_epsilon: float | None = None  # recomputed epsilon of the whole ledger
    head_hash: str = GENESIS_HASH

    def __bool__(self) -> bool:
        return self.ok


class _Discrepancy(Exception):
    def __init__(self, message: str, line: int | None, round_number: Any = None) -> None:
        super().__init__(message)
        self.line = line
        self.round = round_number if isinstance(round_number, int) else None


def verify_ledger(
    source: LedgerSource,
    *,
    accountant: str | None = None,
    rel_tol: float = 1e-3,
    abs_tol: float = 1e-6,
    expected_entries: int | None = None,
    expected_head_hash: str | None = None,
    max_epsilon_checks: int = 128,
) -> VerifyResult:
    """Verify a ledger file/bytes/stream or a list of entries.

    `accountant=None` recomputes with the recorded accountant and requires a match
    within tolerance. Naming another accountant instead requires the recorded epsilon
    to be at least that accountant's (it must remain an upper bound, e.g. recorded
    RDP >= recomputed PLD). Truncation at a line boundary leaves a valid shorter
    chain: pass `expected_entries` or `expected_head_hash` (both in report.json) to
    catch it. With more than `max_epsilon_checks` entries, epsilon is recomputed at
    evenly spaced prefixes including the last; monotonicity and budget are checked
    on all of them.
    """
    state = _State()
    try:
        items, tail = _read(source)
        recompute_at = _recompute_indices(len(items), max_epsilon_checks)
        entries: list[Mapping[str, Any]] = []
        for line, item in enumerate(items, start=1):
            # Parse line by line so a garbled line 5 does not mask a bad hash on line 3.
            entry = _parse_line(item, line) if isinstance(item, bytes) else item
            entries.append(entry)
            _check_entry(entry, line, state)
            if line - 1 in recompute_at:
                _check_recomputed_epsilon(entry, line, state, accountant, rel_tol, abs_tol)
            state.passed = line
        if tail:
            raise _Discrepancy(
                f"partial last line ({len(tail)} bytes without a newline): "
                "truncated file or interrupted append",
                len(items) + 1,
            )
        _check_anchors(entries, state, expected_entries, expected_head_hash)
    except _Discrepancy as found:
        return VerifyResult(
            False,
            str(found),
            found.line,
            found.round,
            state.passed,
            state.recomputed,
            state.final_epsilon,
            state.prev_hash,
        )
    if not entries:
        return VerifyResult(True, "empty ledger", entries=0)
    return VerifyResult(
        True,
        f"ledger verified: {len(entries)} entries, epsilon "
        f"{state.final_epsilon:.6g} <= budget {entries[-1]['budget_epsilon']}",
        None,
        None,
        len(entries),
        state.recomputed,
        state.final_epsilon,
        state.prev_hash,
    )


class _State:
    def __init__(self) -> None:
        self.prev_hash = GENESIS_HASH
        self.first: Mapping[str, Any] | None = None
        self.last_epsilon = 0.0
        self.passed = 0
        self.recomputed = 0
        self.final_epsilon: float | None = None
        self.events: list[PrivacyEvent] = []


def _read(source: LedgerSource) -> tuple[list[bytes] | list[Mapping[str, Any]], bytes]:
    """Raw lines (files, bytes, streams) or entries (iterables), plus any unterminated tail."""
    if isinstance(source, (str, os.PathLike)):
        data = Path(source).read_bytes()
    elif isinstance(source, bytes):
        data = source
    elif isinstance(source, io.IOBase) or hasattr(source, "read"):
        raw = source.read()  # type: ignore[union-attr]
        data = raw.encode("utf-8") if isinstance(raw, str) else raw
    else:
        return [dict(entry) for entry in source], b""  # type: ignore[union-attr]
    *lines, tail = data.split(b"\n")
    return lines, tail


def _parse_line(raw: bytes, line: int) -> Mapping[str, Any]:
    try:
        entry = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _Discrepancy(f"line {line}: not valid JSON ({error})", line) from None
    if not isinstance(entry, dict):
        raise _Discrepancy(f"line {line}: not a JSON object", line)
    return entry


def _check_entry(entry: Mapping[str, Any], line: int, state: _State) -> None:
    round_number = entry.get("round")
    missing = [name for name in ENTRY_FIELDS if name not in entry]
    if missing:
        raise _Discrepancy(f"line {line}: missing fields {missing}", line, round_number)
    try:
        check_chain_link(entry, state.prev_hash, line)
    except LedgerCorruptError as error:
        raise _Discrepancy(str(error), line, round_number) from None
    for name in _INTEGER_FIELDS:
        value = entry[name]
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise _Discrepancy(
                f"line {line}: {name}={value!r} is not an integer >= 0", line, round_number
            )
    for name in _NUMERIC_FIELDS:
        value = entry[name]
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise _Discrepancy(
                f"line {line}: {name}={value!r} is not a finite number", line, round_number
            )
    expected_round = line  # rounds start at 1 and are contiguous
    if round_number != expected_round:
        raise _Discrepancy(
            f"line {line}: round {round_number} but expected {expected_round} "
            "(rounds must be contiguous and strictly increasing)",
            line,
            round_number,
        )
    if state.first is None:
        state.first = entry
    for name in RUN_CONSTANT_FIELDS:
        if entry[name] != state.first[name]:
            raise _Discrepancy(
                f"line {line}: {name} changed from {state.first[name]!r} to "
                f"{entry[name]!r} within one run",
                line,
                round_number,
            )
    if entry["epsilon"] < state.last_epsilon:
        raise _Discrepancy(
            f"line {line}: epsilon decreased from {state.last_epsilon!r} to {entry['epsilon']!r}",
            line,
            round_number,
        )
    if entry["epsilon"] > entry["budget_epsilon"]:
        raise _Discrepancy(
            f"line {line}: epsilon {entry['epsilon']!r} exceeds the budget "
            f"{entry['budget_epsilon']!r}",
            line,
            round_number,
        )
    try:
        state.events.append(event_from_entry(entry))
    except (ValueError, TypeError, KeyError) as error:
        raise _Discrepancy(
            f"line {line}: invalid privacy event ({error})", line, round_number
        ) from None
    state.last_epsilon = entry["epsilon"]
    state.prev_hash = entry["hash"]


def _recompute_indices(count: int, max_checks: int) -> set[int]:
    # Evenly spaced prefixes, always including the last one.
    if count <= max_checks:
        return set(range(count))
    step = (count - 1) / (max_checks - 1)
    return {round(k * step) for k in range(max_checks)} | {count - 1}


def _check_recomputed_epsilon(
    entry: Mapping[str, Any],
    line: int,
    state: _State,
    accountant: str | None,
    rel_tol: float,
    abs_tol: float,
) -> None:
    name = accountant or entry["accountant"]
    try:
        recomputed = compute_epsilon(state.events, entry["delta"], name)
    except ValueError as error:
        raise _Discrepancy(
            f"line {line}: cannot recompute epsilon ({error})", line, entry["round"]
        ) from None
    stored = float(entry["epsilon"])
    tolerance = max(abs_tol, rel_tol * recomputed)
    if accountant is None or accountant == entry["accountant"]:
        bad = abs(stored - recomputed) > tolerance
        relation = "differs from"
    else:
        bad = stored < recomputed - tolerance  # stored must stay an upper bound
        relation = "is below"
    if bad:
        raise _Discrepancy(
            f"line {line}: recorded epsilon {stored!r} {relation} the "
            f"recomputed {recomputed!r} ({name})",
            line,
            entry["round"],
        )
    if recomputed > entry["budget_epsilon"] + tolerance:
        raise _Discrepancy(
            f"line {line}: recomputed epsilon {recomputed!r} exceeds the budget "
            f"{entry['budget_epsilon']!r}",
            line,
            entry["round"],
        )
    state.recomputed += 1
    state.final_epsilon = recomputed


def _check_anchors(
    entries: list[Mapping[str, Any]],
    state: _State,
    expected_entries: int | None,
    expected_head_hash: str | None,
) -> None:
    if expected_entries is not None and len(entries) != expected_entries:
        raise _Discrepancy(
            f"ledger has {len(entries)} entries but {expected_entries} were "
            "expected (truncated or extended)",
            min(len(entries), expected_entries) + 1,
        )
    if expected_head_hash is not None and state.prev_hash != expected_head_hash:
        raise _Discrepancy(
            f"ledger head hash {state.prev_hash} differs from the expected "
            f"{expected_head_hash} (truncated or extended)",
            len(entries),
        )
