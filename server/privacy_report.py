"""Privacy reports of a run directory: report.json + report.html from the ledger."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fedveil.privacy.dp import DpConfig, build_report, render_html, verify_ledger

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
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
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


def verify_run(run_dir: str | Path) -> tuple[bool, str]:
    """Recompute the ledger independently; anchored to report.json's head hash when present."""
    run_dir = Path(run_dir)
    path = ledger_path(run_dir)
    if not path.exists():
        return False, f"{path}: no privacy ledger"
    anchor = path.parent / "report.json"
    kwargs: dict[str, Any] = {}
    if anchor.exists():
        report = json.loads(anchor.read_text())
        kwargs = {
            "expected_entries": report.get("ledger_entries"),
            "expected_head_hash": report.get("ledger_head_hash"),
        }
    result = verify_ledger(path, **kwargs)
    return bool(result.ok), str(result.message)
