"""Independent ledger verifier: signatures, chain, run state, budget, recomputed epsilon.

Trusts nothing stored except the events themselves: epsilon is recomputed from
(q, z, steps, sampling, neighbouring) of every prefix and compared with the
recorded value, and a Skellam release's z is recomputed from its recorded
discrete-mechanism parameters. Stops at, and reports, the FIRST discrepancy in
file order.

Three outcomes (VerifyResult.status, with exit codes for the CLI):
- "final" (EXIT_FINAL = 0): every entry is signed and consistent and the run's
  signed final record ends the ledger;
- "interrupted" (EXIT_INTERRUPTED = 3): the same, but the ledger ends with a signed
  interruption record: resumable, not a finished run, so a finished run cut back
  to its interruption record never passes as finished;
- "failed" (EXIT_FAILED = 1): unsigned entries, a bad signature, a key that cannot
  be found, a ledger that ends without a final or interruption record (truncated
  or still running), a witnessed head the chain does not hold, or any other
  discrepancy.

The coordinator's bound (ledger schema 2, distributed DP): where a release or closing
record states `epsilon_coordinator_bound`, the unamplified epsilon of a client in every
release so far, it is recomputed from the recorded events like epsilon, must never
decrease, and with budget_against = "coordinator" must stay within the budget. A
schema-2 entry that carries the realised `epsilon_coordinator_max` (a participation
count) fails. Schema-1 ledgers (no `schema` field) are still verified; their realised
figure cannot be checked from the ledger alone and the result says so. An unknown
schema fails, naming it.

The opening record (ledger schema 3): a schema-3 ledger starts with a signed "open"
entry carrying the run's plan and its `public_key`, whose key id must be the id that
signs the whole chain, and every later entry names the opening (`opening`, its hash).
A schema-2 ledger (no opening) still verifies as schema 2 and the result says that
devices could not pin its key; a schema never goes back within one ledger.

Asynchronous DP: a ledger whose releases state `max_participations` P (unsampled,
run-constant) is recomputed as the composition of the P least-noisy releases so far,
the most any client can be in (participation.py); so is its coordinator's bound
(asynchronous distributed DP: a client in P group releases, unamplified).

Second accountants: the recorded epsilon passes iff it is at least
(1 - SECOND_ACCOUNTANT_REL_TOL) times the smallest epsilon the named sound
accountants give for the recorded events, i.e. it is not below every sound upper
bound by more than 0.1%.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from fedveil.protocol.dp_rules import (
    DP_FTRL,
    LEGACY_ACCOUNTANTS,
    SKELLAM_ACCOUNTANTS,
    SKELLAM_RDP_INTEGER,
    sound_accountants,
    verifiable_accountants,
)

from .accounting import compute_epsilon, individual_epsilon
from .events import PrivacyEvent, event_from_entry
from .ledger import (
    CLOSE_KINDS,
    ENTRY_FIELDS,
    FINAL,
    GENESIS_HASH,
    INTERRUPTED,
    LEDGER_SCHEMA,
    LEGACY_SCHEMA,
    OPEN,
    OPENING_FIELD,
    RELEASE,
    SCHEMA_2,
    WITNESS_FIELDS,
    LedgerCorruptError,
    check_chain_link,
    check_sequence,
    entry_kind,
    entry_schema,
    signed_message,
)
from .participation import capped_events
from .signing import find_public_key, key_dir, key_id_for, verify_signature
from .skellam import SkellamParams

STATUS_FINAL = "final"
STATUS_INTERRUPTED = "interrupted"
STATUS_FAILED = "failed"
EXIT_FINAL = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 3
EXIT_CODES = {STATUS_FINAL: EXIT_FINAL, STATUS_INTERRUPTED: EXIT_INTERRUPTED}

SECOND_ACCOUNTANT_REL_TOL = 1e-3  # recorded may sit at most 0.1% below the tightest
SKELLAM_Z_REL_TOL = 1e-9
ALL_SOUND = "all"  # as a second accountant: every sound accountant for the run
CAP = "max_participations"  # asynchronous DP: epsilon composes at most this many releases
BOUND = "epsilon_coordinator_bound"  # schema 2: a client in every release (public)
REALISED = "epsilon_coordinator_max"  # a participation count: never in schema 2
SCHEMA_RANK = {LEGACY_SCHEMA: 1, SCHEMA_2: 2, LEDGER_SCHEMA: 3}
NO_OPENING_NOTE = (
    f"ledger schema {SCHEMA_2}: no opening record, so devices could not pin its key "
    f"before round 1; {LEDGER_SCHEMA} ledgers open with one"
)
LEGACY_NOTE = (
    f"ledger schema {LEGACY_SCHEMA}: its {REALISED} (realised, from participation counts) "
    f"cannot be checked from the ledger alone; {LEDGER_SCHEMA} ledgers state {BOUND}"
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
_INTEGER_FIELDS = ("round",)
_LEGACY_INTEGER_FIELDS = ("cohort_planned", "cohort_aggregated")  # old ledgers only

LedgerSource = str | os.PathLike[str] | bytes | BinaryIO | TextIO | Iterable[Mapping[str, Any]]
KeyLookup = Callable[[str], "bytes | None"]


@dataclass(frozen=True)
class VerifyResult:
    ok: bool  # True only for a complete, finished run ("final")
    message: str
    line: int | None = None  # 1-based line (entry index) of the first discrepancy
    round: int | None = None
    entries: int = 0  # entries that passed every check
    epsilon_recomputed: int = 0  # how many prefixes had epsilon recomputed
    final_epsilon: float | None = None  # recomputed epsilon of the whole ledger
    head_hash: str = GENESIS_HASH
    status: str = STATUS_FAILED
    run_id: str | None = None
    key_id: str | None = None
    releases: int = 0
    training_round: int | None = None  # of the closing (final/interruption) record
    witnesses: int = 0  # witnessed heads found in the chain
    schema: str | None = None  # of the last entry checked

    def __bool__(self) -> bool:
        return self.ok

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, EXIT_FAILED)

    @property
    def resumable(self) -> bool:
        return self.status == STATUS_INTERRUPTED


class _Discrepancy(Exception):
    def __init__(self, message: str, line: int | None, round_number: Any = None) -> None:
        super().__init__(message)
        self.line = line
        self.round = round_number if isinstance(round_number, int) else None


def verify_ledger(
    source: LedgerSource,
    *,
    accountant: str | Sequence[str] | None = None,
    rel_tol: float = 1e-3,
    abs_tol: float = 1e-6,
    expected_entries: int | None = None,
    expected_head_hash: str | None = None,
    anchors: Iterable[str] = (),
    max_epsilon_checks: int = 128,
    public_key: bytes | None = None,
    find_key: KeyLookup | None = None,
    witnesses: Iterable[Mapping[str, Any]] = (),
) -> VerifyResult:
    """Verify a ledger file/bytes/stream or a list of entries.

    Epsilon is always recomputed with the recorded accountant and must match
    within tolerance. `accountant` additionally names second accountants (one
    name, several, or "all" for every sound one): the recorded epsilon must be at
    least (1 - 0.001) x the smallest of theirs.

    Signatures: `public_key` (raw 32 bytes) is the only key accepted when given;
    otherwise each entry's key is looked up by key_id with `find_key` (default:
    the local key store). `witnesses` are ledger heads devices kept (run_id, seq,
    hash, key_id, signature): each must be in the chain, which catches a chain
    re-signed by the operator and a rollback to an older signed prefix.

    `expected_entries`/`expected_head_hash` pin the chain's exact length and head;
    `anchors` are entry hashes the chain must contain (e.g. report.json's head).
    With more than `max_epsilon_checks` releases, epsilon is recomputed at evenly
    spaced prefixes including the last; monotonicity and budget are checked on all.
    """
    second = _second_accountants(accountant)
    state = _State(public_key, find_key or find_public_key)
    try:
        items, tail = _read(source)
        _check_items(items, state, second, rel_tol, abs_tol, max_epsilon_checks)
        if tail:
            raise _Discrepancy(
                f"partial last line ({len(tail)} bytes without a newline): "
                "truncated file or interrupted append",
                len(items) + 1,
            )
        _check_witnesses(list(witnesses), state)
        _check_anchors(state, expected_entries, expected_head_hash, anchors)
        _check_closed(state)
    except _Discrepancy as found:
        return _failed(found, state)
    return _verified(state)


def _check_items(
    items: list[bytes] | list[Mapping[str, Any]],
    state: _State,
    second: tuple[str, ...],
    rel_tol: float,
    abs_tol: float,
    max_epsilon_checks: int,
) -> None:
    """Check each entry in order (chain, signature, fields), recomputing epsilon at the
    chosen releases and at every closing record."""
    recompute_at = _recompute_indices(len(items), max_epsilon_checks)
    for line, item in enumerate(items, start=1):
        # Parse line by line so a garbled line 5 does not mask a bad hash on line 3.
        entry = _parse_line(item, line) if isinstance(item, bytes) else item
        _check_entry(entry, line, state)
        if entry_kind(entry) == RELEASE:
            state.last_release_checked = False
            if line - 1 in recompute_at:
                _check_recomputed_epsilon(entry, line, state, second, rel_tol, abs_tol)
        elif entry_kind(entry) == OPEN:
            _check_opening(entry, line, state)
        else:
            _check_close(entry, line, state, second, rel_tol, abs_tol)
        state.entries.append(entry)
        state.passed = line


def _failed(found: _Discrepancy, state: _State) -> VerifyResult:
    """The result for the first discrepancy, with how far the ledger checked out."""
    return VerifyResult(
        ok=False,
        message=str(found),
        line=found.line,
        round=found.round,
        entries=state.passed,
        epsilon_recomputed=state.recomputed,
        final_epsilon=state.final_epsilon,
        head_hash=state.prev_hash,
        status=STATUS_FAILED,
        run_id=state.run_id,
        key_id=state.key_id,
        releases=state.releases,
        schema=state.schema,
    )


def _verified(state: _State) -> VerifyResult:
    """The result for a ledger that checked out: final, or interrupted (resumable)."""
    last = state.entries[-1]
    final = entry_kind(last) == FINAL
    budget = state.first["budget_epsilon"] if state.first is not None else None
    epsilon = state.final_epsilon if state.final_epsilon is not None else 0.0
    summary = (
        f"{len(state.entries)} entries, {state.releases} releases, epsilon {epsilon:.6g}"
        + (f" <= budget {budget}" if budget is not None else "")
        + f", signed by key {state.key_id}"
        + (f", {state.witnesses} witnessed heads found" if state.witnesses else "")
        + (f"; {LEGACY_NOTE}" if state.schema == LEGACY_SCHEMA else "")
        + _legacy_accountant_note(state)
        + (f"; {NO_OPENING_NOTE}" if state.schema == SCHEMA_2 else "")
    )
    if final:
        message = f"final: run {state.run_id} finished at training round {last['training_round']}"
    else:
        message = (
            f"interrupted at training round {last['training_round']} (resumable): run "
            f"{state.run_id} has not finished"
        )
    return VerifyResult(
        ok=final,
        message=f"{message}; {summary}",
        entries=len(state.entries),
        epsilon_recomputed=state.recomputed,
        final_epsilon=epsilon,
        head_hash=state.prev_hash,
        status=STATUS_FINAL if final else STATUS_INTERRUPTED,
        run_id=state.run_id,
        key_id=state.key_id,
        releases=state.releases,
        training_round=int(last["training_round"]),
        witnesses=state.witnesses,
        schema=state.schema,
    )


def read_witness_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The heads in a device's witness file (JSONL, one head per line)."""
    heads = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            head = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} line {number}: not valid JSON ({error})") from None
        if not isinstance(head, dict):
            raise ValueError(f"{path} line {number}: not a JSON object")
        heads.append(head)
    return heads


class _State:
    def __init__(self, public_key: bytes | None, find_key: KeyLookup) -> None:
        self.public_key = public_key
        self.trusted_key_id = key_id_for(public_key) if public_key is not None else None
        self.find_key = find_key
        self.key: bytes | None = None
        self.key_id: str | None = None
        self.run_id: str | None = None
        self.prev_hash = GENESIS_HASH
        self.first: Mapping[str, Any] | None = None
        self.opening_hash: str | None = None  # schema 3: the opening record's hash
        self.skellam: Mapping[str, Any] | None = None
        self.last_epsilon = 0.0
        self.last_bound = 0.0
        self.schema: str | None = None
        self.last_close_round = -1
        self.passed = 0
        self.releases = 0
        self.recomputed = 0
        self.witnesses = 0
        self.last_release_checked = True
        self.final_epsilon: float | None = None
        self.events: list[PrivacyEvent] = []
        self.entries: list[Mapping[str, Any]] = []


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
    """Checks every entry gets: schema, chain link, signature, run binding and order."""
    round_number = entry.get("round")
    kind = entry_kind(entry)
    _check_schema(entry, line, state)
    required = ENTRY_FIELDS if kind == RELEASE else ("timestamp", "prev_hash", "hash")
    missing = [name for name in required if name not in entry]
    if missing:
        raise _Discrepancy(f"line {line}: missing fields {missing}", line, round_number)
    try:
        check_chain_link(entry, state.prev_hash, line)
    except LedgerCorruptError as error:
        raise _Discrepancy(str(error), line, round_number) from None
    _check_signature(entry, line, state)
    run_id = entry.get("run_id")
    if not (isinstance(run_id, str) and run_id):
        raise _Discrepancy(
            f"line {line}: run_id={run_id!r}; every entry must name its run", line, round_number
        )
    if state.run_id is not None and run_id != state.run_id:
        raise _Discrepancy(
            f"line {line}: run_id {run_id!r} differs from the ledger's run {state.run_id!r}",
            line,
            round_number,
        )
    state.run_id = run_id
    if "seq" not in entry:
        raise _Discrepancy(f"line {line}: missing field 'seq'", line, round_number)
    previous = state.entries[-1] if state.entries else None
    try:
        check_sequence(entry, line, state.releases, previous)
    except LedgerCorruptError as error:
        raise _Discrepancy(str(error), line, round_number) from None
    if kind == RELEASE:
        _check_release(entry, line, state)
        state.releases += 1
    state.prev_hash = entry["hash"]


def _check_schema(entry: Mapping[str, Any], line: int, state: _State) -> None:
    """A schema this verifier reads, never back to schema 1 after schema 2, and no
    participation count where schema 2 states the bound."""
    schema = entry_schema(entry)
    if schema not in SCHEMA_RANK:
        raise _Discrepancy(
            f"line {line}: ledger schema {schema!r} is not one this verifier reads; allowed: "
            f"{LEDGER_SCHEMA!r}, {SCHEMA_2!r} or {LEGACY_SCHEMA!r} (no schema field); use a "
            "newer fedveil",
            line,
            entry.get("round"),
        )
    if state.schema is not None and SCHEMA_RANK[schema] < SCHEMA_RANK[state.schema]:
        raise _Discrepancy(
            f"line {line}: ledger schema {schema!r} after {state.schema!r} entries (a schema "
            "never goes back within one ledger)",
            line,
            entry.get("round"),
        )
    if schema == LEDGER_SCHEMA:
        _check_opening_link(entry, line, state)
    if schema != LEGACY_SCHEMA and REALISED in entry:
        raise _Discrepancy(
            f"line {line}: {REALISED}={entry[REALISED]!r} in a {schema} entry: the "
            "realised figure counts how often clients took part and belongs in the "
            f"operator's private annex; the public ledger states {BOUND}",
            line,
            entry.get("round"),
        )
    state.schema = schema


def _check_opening_link(entry: Mapping[str, Any], line: int, state: _State) -> None:
    """Schema 3: line 1 is the opening record, and every later entry names it."""
    if line == 1:
        if entry_kind(entry) != OPEN:
            raise _Discrepancy(
                f"line 1: a {LEDGER_SCHEMA} ledger starts with its opening record; found "
                f"kind={entry_kind(entry)!r} (opening removed?)",
                1,
                entry.get("round"),
            )
        return
    if state.opening_hash is None:
        raise _Discrepancy(
            f"line {line}: a {LEDGER_SCHEMA} entry in a ledger that did not open with an "
            "opening record",
            line,
            entry.get("round"),
        )
    if entry.get(OPENING_FIELD) != state.opening_hash:
        raise _Discrepancy(
            f"line {line}: {OPENING_FIELD}={entry.get(OPENING_FIELD)!r} is not the run's "
            f"opening record {state.opening_hash} (an entry of another chain)",
            line,
            entry.get("round"),
        )


def _check_opening(entry: Mapping[str, Any], line: int, state: _State) -> None:
    """The opening record: its plan, and a public key that is the one signing the chain."""
    if not isinstance(entry.get("plan"), Mapping):
        raise _Discrepancy(f"line {line}: opening record plan={entry.get('plan')!r:.80}", line)
    try:
        key = bytes.fromhex(str(entry.get("public_key")))
    except ValueError:
        key = b""
    if len(key) != 32 or key_id_for(key) != state.key_id:
        raise _Discrepancy(
            f"line {line}: the opening record's public_key={entry.get('public_key')!r:.80} "
            f"is not the key that signs the ledger (key_id {state.key_id})",
            line,
        )
    state.opening_hash = str(entry["hash"])


def _check_signature(entry: Mapping[str, Any], line: int, state: _State) -> None:
    round_number = entry.get("round")
    key_id, signature = entry.get("key_id"), entry.get("signature")
    if not isinstance(key_id, str) or not isinstance(signature, str):
        raise _Discrepancy(
            f"line {line}: unsigned entry (key_id={key_id!r}, signature present: "
            f"{isinstance(signature, str)}); a ledger must be signed by the coordinator's key",
            line,
            round_number,
        )
    if state.key_id is None:
        if state.trusted_key_id is not None and key_id != state.trusted_key_id:
            raise _Discrepancy(
                f"line {line}: signed by key_id {key_id}, but the given public key is "
                f"key_id {state.trusted_key_id}",
                line,
                round_number,
            )
        key = state.public_key if state.public_key is not None else state.find_key(key_id)
        if key is None:
            raise _Discrepancy(
                f"line {line}: no public key with key_id {key_id} in the key store "
                f"{key_dir()}; pass the run's public key with --public-key",
                line,
                round_number,
            )
        state.key, state.key_id = key, key_id
    elif key_id != state.key_id:
        raise _Discrepancy(
            f"line {line}: signed by key_id {key_id}, but the run's entries before it by "
            f"key_id {state.key_id}",
            line,
            round_number,
        )
    try:
        raw = bytes.fromhex(signature)
    except ValueError:
        raw = b""
    assert state.key is not None
    if not verify_signature(state.key, raw, signed_message(entry["hash"])):
        raise _Discrepancy(
            f"line {line}: bad signature for key_id {key_id} (entry forged or re-hashed)",
            line,
            round_number,
        )


def _check_release(entry: Mapping[str, Any], line: int, state: _State) -> None:
    round_number = entry.get("round")
    for name in _INTEGER_FIELDS + tuple(n for n in _LEGACY_INTEGER_FIELDS if n in entry):
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
    if state.first is None:
        # Old ledgers may name a legacy accountant: they verify as what they were.
        sound = verifiable_accountants(entry["mechanism"], entry["sampling"], entry["neighbouring"])
        if entry["accountant"] not in sound:
            raise _Discrepancy(
                f"line {line}: accountant {entry['accountant']!r} is not sound for "
                f"mechanism={entry['mechanism']!r}, sampling={entry['sampling']!r}, "
                f"neighbouring={entry['neighbouring']!r}; sound: {list(sound)}",
                line,
                round_number,
            )
        state.first = entry
    for name in RUN_CONSTANT_FIELDS:
        if entry[name] != state.first[name]:
            raise _Discrepancy(
                f"line {line}: {name} changed from {state.first[name]!r} to "
                f"{entry[name]!r} within one run",
                line,
                round_number,
            )
    _check_cap(entry, line, state)
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
    _check_skellam(entry, line, state)
    _check_bound_field(entry, line, state)
    try:
        state.events.append(event_from_entry(entry))
    except (ValueError, TypeError, KeyError) as error:
        raise _Discrepancy(
            f"line {line}: invalid privacy event ({error})", line, round_number
        ) from None
    state.last_epsilon = entry["epsilon"]


def _check_cap(entry: Mapping[str, Any], line: int, state: _State) -> None:
    """Asynchronous DP (participation.py): the cap is run-constant, an integer >= 1, and
    only on unsampled releases (a cap replaces amplification; it is not added to it)."""
    cap = entry.get(CAP)
    assert state.first is not None
    if cap != state.first.get(CAP):
        raise _Discrepancy(
            f"line {line}: {CAP} changed from {state.first.get(CAP)!r} to {cap!r} within one run",
            line,
            entry.get("round"),
        )
    if cap is None:
        return
    if not (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1):
        raise _Discrepancy(
            f"line {line}: {CAP}={cap!r} is invalid; allowed: an integer >= 1",
            line,
            entry.get("round"),
        )
    if entry["sampling_rate"] != 1.0:
        raise _Discrepancy(
            f"line {line}: {CAP}={cap!r} with sampling_rate={entry['sampling_rate']!r}: a "
            "participation cap accounts unsampled releases (sampling_rate 1.0)",
            line,
            entry.get("round"),
        )


def _check_bound_field(entry: Mapping[str, Any], line: int, state: _State) -> None:
    """A release's bound where stated: finite, never decreasing, within the budget when
    the budget caps it (recomputed at the chosen prefixes)."""
    round_number = entry.get("round")
    if BOUND not in entry:
        return  # nothing stated, nothing to check
    value = entry[BOUND]
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)) or not (
        math.isfinite(value) and value >= 0
    ):
        raise _Discrepancy(
            f"line {line}: {BOUND}={value!r} is invalid; allowed: a finite number >= 0",
            line,
            round_number,
        )
    if value < state.last_bound:
        raise _Discrepancy(
            f"line {line}: {BOUND} decreased from {state.last_bound!r} to {value!r}",
            line,
            round_number,
        )
    if entry.get("budget_against") == "coordinator" and value > entry["budget_epsilon"]:
        raise _Discrepancy(
            f"line {line}: {BOUND} {value!r} exceeds the budget {entry['budget_epsilon']!r} "
            "(budget_against = 'coordinator')",
            line,
            round_number,
        )
    state.last_bound = float(value)


def _check_recomputed_bound(
    stated: Any, line: int, state: _State, rel_tol: float, abs_tol: float, what: str
) -> None:
    """`stated` must equal the unamplified epsilon of a client in every release so far (in
    at most `max_participations` of them where the run is capped), recomputed from the
    recorded events alone."""
    delta = float(state.first["delta"]) if state.first is not None else 0.0
    cap = state.first.get(CAP) if state.first is not None else None
    try:
        events = capped_events(state.events, cap)
        recomputed = individual_epsilon(events, delta, _bound_accountant(state)) if events else 0.0
    except ValueError as error:
        raise _Discrepancy(f"line {line}: cannot recompute {BOUND} ({error})", line) from None
    tolerance = max(abs_tol, rel_tol * recomputed)
    if (
        not (isinstance(stated, (int, float)) and not isinstance(stated, bool))
        or not abs(float(stated) - recomputed) <= tolerance
    ):
        raise _Discrepancy(
            f"line {line}: {what} states {BOUND}={stated!r} but a client in "
            f"{sum(e.steps for e in events)} of the {len(state.events)} releases has "
            f"{recomputed!r} (recomputed from the ledger)",
            line,
        )


def _bound_accountant(state: _State) -> str:
    """The Skellam accountant the coordinator's bound is recomputed with: the ledger's own
    where it names one (the legacy fractional-order one included), else the integer one."""
    named = state.first.get("accountant") if state.first is not None else None
    return named if named in SKELLAM_ACCOUNTANTS else SKELLAM_RDP_INTEGER


def _legacy_accountant_note(state: _State) -> str:
    named = state.first.get("accountant") if state.first is not None else None
    if named not in LEGACY_ACCOUNTANTS:
        return ""
    return (
        f"; accountant {named!r} (legacy: Renyi orders the bound is not proven for), "
        f"recomputed as recorded; new ledgers use {LEGACY_ACCOUNTANTS[named]!r}"
    )


def _check_skellam(entry: Mapping[str, Any], line: int, state: _State) -> None:
    """Recompute a Skellam release's Gaussian-equivalent z from its discrete parameters."""
    round_number = entry.get("round")
    has_params = "skellam" in entry or "noise_shares" in entry
    if entry["mechanism"] == "distributed_skellam" and not has_params:
        raise _Discrepancy(
            f"line {line}: a distributed_skellam release must record 'skellam' and "
            "'noise_shares' so its z can be re-checked",
            line,
            round_number,
        )
    if not has_params:
        return
    shares, recorded = entry.get("noise_shares"), entry.get("skellam")
    if not (isinstance(shares, int) and not isinstance(shares, bool) and shares >= 1):
        raise _Discrepancy(
            f"line {line}: noise_shares={shares!r} is invalid; allowed: an integer >= 1",
            line,
            round_number,
        )
    if not isinstance(recorded, dict):
        raise _Discrepancy(
            f"line {line}: skellam={recorded!r} is not an object", line, round_number
        )
    if state.skellam is not None and recorded != state.skellam:
        raise _Discrepancy(
            f"line {line}: Skellam parameters changed within one run "
            f"(from {state.skellam!r} to {recorded!r})",
            line,
            round_number,
        )
    state.skellam = recorded
    # Under zero-out one client's contribution moves by up to B, as under add/remove
    # (factor 1); replace-one doubles it. noise_multiplier_for applies that factor.
    try:
        params = SkellamParams.from_dict(dict(recorded))
        z = params.noise_multiplier_for(shares, entry["neighbouring"])
    except (TypeError, ValueError) as error:
        raise _Discrepancy(
            f"line {line}: cannot recompute the Skellam z ({error})", line, round_number
        ) from None
    stored = float(entry["noise_multiplier"])
    if abs(z - stored) > SKELLAM_Z_REL_TOL * abs(stored):
        raise _Discrepancy(
            f"line {line}: noise_multiplier {stored!r} differs from {z!r}, the Gaussian-"
            f"equivalent z of the recorded Skellam parameters with {shares} noise shares",
            line,
            round_number,
        )


def _check_close(
    entry: Mapping[str, Any],
    line: int,
    state: _State,
    second: tuple[str, ...],
    rel_tol: float,
    abs_tol: float,
) -> None:
    kind = entry_kind(entry)
    assert kind in CLOSE_KINDS
    training_round = entry.get("training_round")
    if not (
        isinstance(training_round, int)
        and not isinstance(training_round, bool)
        and training_round >= state.last_close_round
        and training_round >= 0
    ):
        raise _Discrepancy(
            f"line {line}: {kind} record training_round={training_round!r} is invalid; "
            f"allowed: an integer >= {max(state.last_close_round, 0)}",
            line,
        )
    state.last_close_round = training_round
    if not state.last_release_checked and state.entries:
        # Recompute at the last release before every close, whatever the spacing.
        last_release = next(e for e in reversed(state.entries) if entry_kind(e) == RELEASE)
        _check_recomputed_epsilon(last_release, line - 1, state, second, rel_tol, abs_tol)
    if kind == FINAL or "epsilon" in entry:
        stated = entry.get("epsilon")
        if not (isinstance(stated, (int, float)) and not isinstance(stated, bool)) or not (
            abs(float(stated) - state.last_epsilon) <= 1e-9 * max(1.0, state.last_epsilon)
        ):
            raise _Discrepancy(
                f"line {line}: {kind} record states epsilon={stated!r} but the last release "
                f"recorded {state.last_epsilon!r}",
                line,
            )
    if BOUND in entry:
        _check_recomputed_bound(entry.get(BOUND), line, state, rel_tol, abs_tol, f"{kind} record")
    if kind == INTERRUPTED and not isinstance(entry.get("reason", ""), str):
        raise _Discrepancy(f"line {line}: reason={entry.get('reason')!r} is not a string", line)


def _recompute_indices(count: int, max_checks: int) -> set[int]:
    # Evenly spaced prefixes, always including the last one.
    if count <= max_checks:
        return set(range(count))
    step = (count - 1) / (max_checks - 1)
    return {round(k * step) for k in range(max_checks)} | {count - 1}


def _second_accountants(accountant: str | Sequence[str] | None) -> tuple[str, ...]:
    if accountant is None:
        return ()
    if isinstance(accountant, str):
        return (accountant,)
    return tuple(accountant)


def _sound_accountants(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """Accountants sound for this release's mechanism, sampling and neighbouring."""
    return sound_accountants(entry["mechanism"], entry["sampling"], entry["neighbouring"])


def _check_recomputed_epsilon(
    entry: Mapping[str, Any],
    line: int,
    state: _State,
    second: tuple[str, ...],
    rel_tol: float,
    abs_tol: float,
) -> None:
    stored = float(entry["epsilon"])
    if entry["mechanism"] == DP_FTRL:
        recomputed = _ftrl_epsilon(entry, line, state)
        second = ()  # one Gaussian over the sensitivity: no events to compose
    else:
        recomputed = _epsilon(state.events, entry, entry["accountant"], line)
    tolerance = max(abs_tol, rel_tol * recomputed)
    if abs(stored - recomputed) > tolerance:
        raise _Discrepancy(
            f"line {line}: recorded epsilon {stored!r} differs from the recomputed "
            f"{recomputed!r} ({entry['accountant']})",
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
    if BOUND in entry:
        _check_recomputed_bound(entry[BOUND], line, state, rel_tol, abs_tol, "release")
    if second:
        _check_second_accountants(entry, line, state, second, stored, abs_tol)
    state.recomputed += 1
    state.final_epsilon = recomputed
    state.last_release_checked = True


def _ftrl_epsilon(entry: Mapping[str, Any], line: int, state: _State) -> float:
    """DP-FTRL: the sensitivity recomputed from the recorded factorisation and schema
    (privacy/dp/ftrl/ledger_fields.py), then epsilon; the `ftrl` record is run-constant."""
    from .ftrl.ledger_fields import FTRL_FIELD, recompute_ftrl_epsilon

    first = state.first or entry
    if entry.get(FTRL_FIELD) != first.get(FTRL_FIELD):
        raise _Discrepancy(
            f"line {line}: {FTRL_FIELD} changed from {first.get(FTRL_FIELD)!r} to "
            f"{entry.get(FTRL_FIELD)!r} within one run",
            line,
            entry["round"],
        )
    try:
        return recompute_ftrl_epsilon(entry)
    except ValueError as error:
        raise _Discrepancy(f"line {line}: {error}", line, entry["round"]) from None


def _check_second_accountants(
    entry: Mapping[str, Any],
    line: int,
    state: _State,
    second: tuple[str, ...],
    stored: float,
    abs_tol: float,
) -> None:
    """Pass iff stored >= (1 - 0.001) * min over the named sound accountants."""
    sound = _sound_accountants(entry)
    names = sound if ALL_SOUND in second else second
    unsound = [name for name in names if name not in sound]
    if unsound or not names:
        raise _Discrepancy(
            f"line {line}: second accountant {unsound or list(second)} is not sound for "
            f"mechanism={entry['mechanism']!r}, sampling={entry['sampling']!r}, "
            f"neighbouring={entry['neighbouring']!r}; allowed: {list(sound)} or {ALL_SOUND!r}",
            line,
            entry["round"],
        )
    bounds = {name: _epsilon(state.events, entry, name, line) for name in names}
    tightest = min(bounds, key=lambda name: bounds[name])
    floor = (1 - SECOND_ACCOUNTANT_REL_TOL) * bounds[tightest] - abs_tol
    if stored < floor:
        raise _Discrepancy(
            f"line {line}: recorded epsilon {stored!r} is below the recomputed "
            f"{bounds[tightest]!r} ({tightest}, the tightest of {list(names)}) by more "
            f"than {SECOND_ACCOUNTANT_REL_TOL:.1%}",
            line,
            entry["round"],
        )


def _epsilon(
    events: list[PrivacyEvent], entry: Mapping[str, Any], accountant: str, line: int
) -> float:
    try:
        # Under a participation cap a client is in at most that many of the releases.
        capped = capped_events(events, entry.get(CAP))
        return compute_epsilon(capped, entry["delta"], accountant)
    except ValueError as error:
        raise _Discrepancy(
            f"line {line}: cannot recompute epsilon ({error})", line, entry["round"]
        ) from None


def _check_witnesses(witnesses: list[Mapping[str, Any]], state: _State) -> None:
    """Every head a device witnessed must be in the chain, signature and all."""
    end = len(state.entries)
    for number, head in enumerate(witnesses, start=1):
        missing = [name for name in WITNESS_FIELDS if name not in head]
        if missing:
            raise _Discrepancy(f"witness {number}: missing fields {missing}", None)
        if head["run_id"] != state.run_id:
            raise _Discrepancy(
                f"witness {number}: a head of run {head['run_id']!r}, but this ledger is run "
                f"{state.run_id!r}",
                None,
            )
        seq = head["seq"]
        if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1):
            raise _Discrepancy(f"witness {number}: seq={seq!r} is not an integer >= 1", None)
    # A head beyond the end first: a rollback also rewrites the entries it re-appends.
    furthest = max((head["seq"] for head in witnesses), default=0)
    if furthest > end:
        raise _Discrepancy(
            f"a device saw the ledger at seq {furthest}, but it ends at seq {end} "
            "(rolled back or truncated)",
            end + 1,
        )
    for head in witnesses:
        entry = state.entries[head["seq"] - 1]
        differs = [
            name for name in ("hash", "key_id", "signature") if head[name] != entry.get(name)
        ]
        if differs:
            raise _Discrepancy(
                f"line {head['seq']}: the entry differs from the head a device witnessed "
                f"({differs}): the chain was rewritten or re-signed",
                head["seq"],
                entry.get("round"),
            )
        state.witnesses += 1


def _check_anchors(
    state: _State,
    expected_entries: int | None,
    expected_head_hash: str | None,
    anchors: Iterable[str],
) -> None:
    entries = state.entries
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
    hashes = {entry["hash"] for entry in entries} | {GENESIS_HASH}
    for anchor in anchors:
        if anchor not in hashes:
            raise _Discrepancy(
                f"anchored head {anchor} is not in the ledger (rolled back, truncated or "
                "rewritten)",
                len(entries) + 1,
            )


def _check_closed(state: _State) -> None:
    if not state.entries:
        raise _Discrepancy(
            "empty ledger: no final or interruption record (truncated, or the run wrote none)",
            1,
        )
    last = state.entries[-1]
    if entry_kind(last) not in CLOSE_KINDS:
        raise _Discrepancy(
            f"truncated: the ledger ends with release round {last.get('round')} at line "
            f"{len(state.entries)}, not with a signed final or interruption record (lines "
            "removed, or the run is still going)",
            len(state.entries) + 1,
        )
