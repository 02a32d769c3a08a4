"""The figures a run directory publishes beside its ledger, checked against the ledger.

Contract: `published_discrepancies(run_dir, entries, ...)` takes the entries of a ledger
that has already verified (signatures, chain, recomputed epsilon) and returns one line
per figure a reader of the run directory would see that the ledger does not prove,
naming the file, the field, the value shown and the ledger's; empty when they all agree.

- privacy/report.json: rebuilt from the ledger up to its `ledger_head_hash` (the report
  of a run that later resumed is anchored at an older head, and is checked against that
  prefix) through the same function that wrote it, with the prefix verified again as its
  writer verified it; every field but `attacks` and `audit` must be equal, nested fields
  named by path (a lowered epsilon, a shortened series, a spliced-in report of another
  run, a verifier's message that states another epsilon).
- privacy/report.html: must be the page report.json renders to (an edited page shows
  numbers the JSON does not hold). A page without its report.json is a discrepancy.
- metrics.jsonl (and epsilon.png, drawn from it): no round past the ledger's closing
  record, and no round's `epsilon` below the largest a release up to that round recorded.
- model.safetensors: where the closing record binds a model (`model_sha256`), the file
  must exist and hash to it (a longer-trained model beside a rolled-back ledger, a model
  of another run). A closing record without the field binds no model (older ledgers).
- summary.json: its `epsilon` (and `epsilon_coordinator_bound`, `delta` where the ledger
  records them) must be the ledger's closing record's, where the ledger holds a release
  (a DP-SGD-only run's summary states its clients' figures, which the ledger does not).

A missing report.json/html or summary.json is not a discrepancy (an auditor may be sent
the ledger alone); a present one that claims anything else is. Numbers are compared
exactly after a JSON round trip (they were written from these very floats), so a
NaN or a string in place of a number fails too.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedveil.privacy.dp import VerifyResult
from fedveil.privacy.dp.ledger import CLOSE_KINDS, MODEL_SHA256, is_sha256_hex
from fedveil.server.engine.model_file import MODEL_FILE, file_sha256

# report.json fields not rebuilt from the ledger: the attack results (`fedveil privacy
# attack`) and the canary audit (`fedveil privacy audit`); the page check covers how
# they are shown.
_NOT_REBUILT = ("attacks", "audit")
# summary.json fields that restate the ledger's closing record.
_SUMMARY_FIELDS = ("epsilon", "epsilon_coordinator_bound", "delta")

ReportBuilder = Callable[[list[dict[str, Any]], VerifyResult], tuple[dict[str, Any], bool]]
PageRenderer = Callable[[dict[str, Any], bool], str]
PrefixVerifier = Callable[[list[dict[str, Any]]], VerifyResult]


def published_discrepancies(
    run_dir: Path,
    entries: list[dict[str, Any]],
    *,
    build: ReportBuilder,
    render: PageRenderer,
    verify_prefix: PrefixVerifier,
) -> list[str]:
    """What metrics.jsonl, summary.json and privacy/report.json/html show that the verified
    `entries` do not prove. `build(prefix, its verification)` rebuilds the report and says
    whether render_html lays it out; `render(report, laid_out)` is its page;
    `verify_prefix` verifies the prefix the report is anchored at as its writer did."""
    problems = _model_discrepancies(Path(run_dir) / MODEL_FILE, entries)
    problems += _summary_discrepancies(Path(run_dir) / "summary.json", entries)
    problems += _metrics_discrepancies(Path(run_dir) / "metrics.jsonl", entries)
    problems += _report_discrepancies(
        Path(run_dir) / "privacy", entries, build, render, verify_prefix
    )
    return problems


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as error:
        return None, f"{path}: unreadable ({error})"


def bound_model_sha256(entries: list[dict[str, Any]]) -> str | None:
    """The model hash the ledger's closing record binds; None: no closing record, or
    one that binds no model."""
    if not entries or entries[-1].get("kind") not in CLOSE_KINDS:
        return None
    value = entries[-1].get(MODEL_SHA256)
    return None if value is None else str(value)


def _model_discrepancies(path: Path, entries: list[dict[str, Any]]) -> list[str]:
    """model.safetensors against the closing record's `model_sha256`, where it has one."""
    if not entries or entries[-1].get("kind") not in CLOSE_KINDS:
        return []
    closing = entries[-1]
    if MODEL_SHA256 not in closing:
        return []
    bound = closing[MODEL_SHA256]
    where = f"the ledger (closing record, seq {closing.get('seq')}) binds {MODEL_SHA256} {bound!r}"
    if not is_sha256_hex(bound):
        return [f"{where}, which is not a SHA-256 (64 lowercase hex digits)"]
    if not path.is_file():
        return [f"{path}: missing, but {where}"]
    try:
        actual = file_sha256(path)
    except OSError as error:
        return [f"{path}: unreadable ({error}); {where}"]
    if actual != bound:
        return [
            f"{path}: sha256 {actual}, but {where} (another model than the run published "
            "as of that record)"
        ]
    return []


def _summary_discrepancies(path: Path, entries: list[dict[str, Any]]) -> list[str]:
    if not path.exists():
        return []
    summary, error = _read_json(path)
    if error is not None:
        return [error]
    if not isinstance(summary, dict):
        return [f"{path}: not a JSON object"]
    if not any(entry.get("kind") == "release" for entry in entries):
        # DP-SGD alone, or stopped before its first release: the closing record's epsilon
        # is 0 and the summary states the clients' DP-SGD figures, not a release's.
        return []
    closing = entries[-1]
    proved = {name: closing[name] for name in _SUMMARY_FIELDS if name in closing}
    if "delta" not in proved and _ledger_delta(entries) is not None:
        proved["delta"] = _ledger_delta(entries)
    problems = []
    for name, value in proved.items():
        if name not in summary:
            problems.append(f"{path}: {name} missing; the ledger has {value!r}")
        elif not _same(summary[name], value):
            problems.append(
                f"{path}: {name} = {summary[name]!r}, but the ledger (closing record, seq "
                f"{closing.get('seq')}) has {value!r}"
            )
    return problems


def _metrics_discrepancies(path: Path, entries: list[dict[str, Any]]) -> list[str]:
    """metrics.jsonl (and the epsilon plot drawn from it): no round past the ledger's
    closing record, and no round's epsilon below what the releases up to it spent."""
    releases = [entry for entry in entries if entry.get("kind") == "release"]
    if not releases or not path.exists():
        return []
    closing = entries[-1].get("training_round")
    try:
        lines = path.read_text().splitlines()
    except (OSError, ValueError) as error:
        return [f"{path}: unreadable ({error})"]
    spent_by = _spent_by(releases)
    problems = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            problems.append(f"{path} line {number}: not JSON")
            continue
        if not isinstance(row, dict) or "epsilon" not in row:
            continue  # a row without a privacy figure states nothing to hold
        at = row.get("round")
        if not (isinstance(at, int) and not isinstance(at, bool)):
            problems.append(f"{path} line {number}: round = {at!r} is not an integer")
            continue
        if isinstance(closing, int) and at > closing:
            problems.append(
                f"{path} line {number}: round {at}, but the ledger closes at training round "
                f"{closing} (rolled back, or rounds released without a charge)"
            )
            continue
        proved = spent_by(at)
        shown = row["epsilon"]
        if not (_is_number(shown) and shown >= proved):
            problems.append(
                f"{path} line {number}: round {at} epsilon = {shown!r}, below the "
                f"{proved!r} the ledger's releases up to round {at} spent"
            )
    return problems


def _spent_by(releases: list[dict[str, Any]]) -> Callable[[int], float]:
    """round -> the largest epsilon a release up to that training round recorded (0 before
    the first): one sort, then a bisection per metrics row."""
    points = sorted(
        (int(e["training_round"]), float(e["epsilon"]))
        for e in releases
        if isinstance(e.get("training_round"), int) and _is_number(e.get("epsilon"))
    )
    rounds = [r for r, _ in points]
    running = list(itertools.accumulate((eps for _, eps in points), max))

    def spent(at: int) -> float:
        index = bisect.bisect_right(rounds, at)
        return running[index - 1] if index else 0.0

    return spent


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ledger_delta(entries: list[dict[str, Any]]) -> Any:
    """The delta the releases were charged at (the closing record's own when it has one)."""
    for entry in reversed(entries):
        if "delta" in entry:
            return entry["delta"]
    return None


def _same(shown: Any, proved: Any) -> bool:
    """Equal as JSON values; a float compares by value, so NaN never matches."""
    if isinstance(proved, float) or isinstance(shown, float):
        if isinstance(shown, bool) or isinstance(proved, bool):
            return False
        if not isinstance(shown, (int, float)) or not isinstance(proved, (int, float)):
            return False
        return math.isfinite(shown) and float(shown) == float(proved)
    return bool(json.dumps(shown, sort_keys=True) == json.dumps(proved, sort_keys=True))


def _report_discrepancies(
    privacy_dir: Path,
    entries: list[dict[str, Any]],
    build: ReportBuilder,
    render: PageRenderer,
    verify_prefix: PrefixVerifier,
) -> list[str]:
    report_path, page_path = privacy_dir / "report.json", privacy_dir / "report.html"
    if not report_path.exists():
        if page_path.exists():
            return [f"{page_path}: no report.json beside it to check its figures against"]
        return []
    stored, error = _read_json(report_path)
    if error is not None:
        return [error]
    if not isinstance(stored, dict):
        return [f"{report_path}: not a JSON object"]
    head = stored.get("ledger_head_hash")
    at = next((i for i, entry in enumerate(entries) if entry.get("hash") == head), None)
    if at is None:  # verify_ledger's anchor check names this first; kept fail-closed
        return [f"{report_path}: ledger_head_hash {head!r} is not in the ledger"]
    prefix = entries[: at + 1]
    plan = prefix[0].get("plan")
    dp_sgd_only = isinstance(plan, dict) and plan.get("mechanism") == "none"
    if not dp_sgd_only and not any(entry.get("kind") == "release" for entry in prefix):
        # Stopped before its first release: the report states the run's config (nothing
        # was spent, so no figure can understate the ledger); nothing to rebuild it from.
        return []
    # Verified again as the report's writer did (no witnesses, no anchors): its words are
    # on the page ("Verified: ... epsilon ..."), so they are held to the ledger too.
    rebuilt, laid_out = build(prefix, verify_prefix(prefix))
    problems = _field_discrepancies(report_path, stored, rebuilt, at + 1)
    if page_path.exists() and not problems:
        try:
            page = page_path.read_text()
        except (OSError, ValueError) as error:
            return [f"{page_path}: unreadable ({error})"]
        if page != render(stored, laid_out):
            problems.append(
                f"{page_path}: differs from the page report.json renders to (edited; "
                "regenerate it with `fedveil privacy report`)"
            )
    return problems


def _field_discrepancies(
    path: Path, stored: Mapping[str, Any], rebuilt: Mapping[str, Any], seq: int
) -> list[str]:
    shown = {k: v for k, v in stored.items() if k not in _NOT_REBUILT}
    proved = json.loads(json.dumps({k: v for k, v in rebuilt.items() if k not in _NOT_REBUILT}))
    found = [
        f"{path}: {where} = {_short(a)}, but the ledger up to its head (seq {seq}) gives "
        f"{_short(b)}"
        for where, a, b in _differences(shown, proved, "")
    ]
    if found:  # an honest cause too: written where the key was missing, or by another version
        found[-1] += (
            " (a report written where the run's public key was not in the key store, or by "
            "another fedveil version, is rewritten from the ledger by `fedveil privacy report`)"
        )
    return found


_ABSENT = "(absent)"


def _differences(shown: Any, proved: Any, where: str) -> list[tuple[str, Any, Any]]:
    """(dotted path, shown, proved) of every leaf where the two JSON values differ."""
    if isinstance(shown, dict) and isinstance(proved, dict):
        found = []
        for key in sorted(set(shown) | set(proved)):
            name = f"{where}.{key}" if where else str(key)
            found += _differences(shown.get(key, _ABSENT), proved.get(key, _ABSENT), name)
        return found
    if isinstance(shown, list) and isinstance(proved, list) and len(shown) == len(proved):
        found = []
        for index, (a, b) in enumerate(zip(shown, proved, strict=True)):
            found += _differences(a, b, f"{where}[{index}]")
        return found
    if isinstance(shown, float) or isinstance(proved, float):
        return [] if _same(shown, proved) else [(where, shown, proved)]
    same = shown == proved and type(shown) is type(proved)
    return [] if same else [(where, shown, proved)]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."
