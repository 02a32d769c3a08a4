"""Privacy reports of a run directory: report.json + report.html from the ledger."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedveil.privacy.dp import DpConfig, VerifyResult, build_report, render_html, verify_ledger
from fedveil.privacy.dp.ledger import RELEASE, entry_kind
from fedveil.privacy.dp.verify import read_witness_file

from .runstore import atomic_write_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def ledger_path(run_dir: Path) -> Path:
    return Path(run_dir) / "privacy" / "ledger.jsonl"


def write_privacy_report(run_dir: str | Path, config: DpConfig | None = None) -> dict[str, Any]:
    """Verify the ledger, then write privacy/report.json and privacy/report.html.

    `config` lets a run that stopped before its first release (budget too small
    for even one round) still get a report saying so.
    """
    run_dir = Path(run_dir)
    path = ledger_path(run_dir)
    if not path.exists() and config is None:
        raise FileNotFoundError(f"{path}: no privacy ledger (was the run made with --dp?)")
    entries: list[dict[str, Any]] = []
    verification = None
    if path.exists():
        verification = verify_ledger(path)
        # Releases only: the interruption/final records spend nothing.
        entries = [
            entry
            for entry in (json.loads(line) for line in path.read_text().splitlines() if line)
            if entry_kind(entry) == RELEASE
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    report = build_report(
        entries,
        config=config,
        verification=verification,
        secure_aggregation=secure_aggregation_mode(run_dir),
    )
    atomic_write_bytes(path.parent / "report.json", (json.dumps(report, indent=2) + "\n").encode())
    atomic_write_bytes(path.parent / "report.html", render_html(report).encode())
    return report


def secure_aggregation_mode(run_dir: Path) -> str | None:
    """ "off", "semi_honest" or "malicious" from the run's config.toml (None if unreadable)."""
    try:
        values = tomllib.loads((Path(run_dir) / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    section = values.get("secagg", {})
    if not isinstance(section, dict):
        return None
    if not section.get("enabled", False):
        return "off"
    threat = section.get("threat", "semi_honest")
    return threat if threat in ("semi_honest", "malicious") else None


def verify_run(
    run_dir: str | Path,
    *,
    public_key: bytes | None = None,
    witnesses: Sequence[str | Path] = (),
    second_accountants: Sequence[str] = (),
) -> VerifyResult:
    """Verify the run's ledger independently (status final / interrupted / failed).

    The public key is `public_key` when given, else found by key id in the local key
    store. Each witness file holds ledger heads a device saw; every one must be in
    the chain. report.json's head hash, when present, is an anchor: the chain must
    contain it (a resumed run may have grown past it, a rolled-back one lacks it).
    """
    run_dir = Path(run_dir)
    path = ledger_path(run_dir)
    if not path.exists():
        return VerifyResult(ok=False, message=f"{path}: no privacy ledger")
    heads: list[dict[str, Any]] = []
    for witness in witnesses:
        try:
            heads.extend(read_witness_file(witness))
        except (OSError, ValueError) as error:
            return VerifyResult(ok=False, message=f"witness file {witness}: {error}")
    anchors: list[str] = []
    anchor = path.parent / "report.json"
    if anchor.exists():
        try:
            head = json.loads(anchor.read_text()).get("ledger_head_hash")
        except (OSError, ValueError, AttributeError) as error:
            return VerifyResult(ok=False, message=f"{anchor}: unreadable ({error})")
        if isinstance(head, str):
            anchors.append(head)
    return verify_ledger(
        path,
        accountant=tuple(second_accountants) or None,
        anchors=anchors,
        public_key=public_key,
        witnesses=heads,
    )
