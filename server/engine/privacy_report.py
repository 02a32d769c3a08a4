"""Privacy reports of a run directory: report.json + report.html from the ledger.

The one writer of privacy/report.json and report.html: beside what the ledger proves it
joins the saved attacks (privacy/attacks/) and the canary audit (privacy/audit.json,
which `fedveil privacy audit` writes and then calls this writer), so rewriting the report
of an audited run keeps its audit. An audit.json that does not parse is refused, naming
the file: a report that dropped the audit silently would mislead.
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedveil.privacy.dp import DpConfig, VerifyResult, build_report, render_html, verify_ledger
from fedveil.privacy.dp.html_report import join_attacks, join_audit
from fedveil.privacy.dp.report import (
    ATTACKS_DIR,
    attacks_section,
    audit_section,
    ledger_only_report,
    operator_report,
    silo_run_report,
)
from fedveil.privacy.dp.silo_verify import verify_silo_ledgers
from fedveil.privacy.dp.verify import STATUS_FAILED, read_witness_file
from fedveil.privacy.secagg.identity_files import load_roster
from fedveil.privacy.secagg.identity_keys import RosterError
from fedveil.server.engine.model_file import MODEL_FILE
from fedveil.server.engine.published_figures import bound_model_sha256, published_discrepancies
from fedveil.server.engine.runstore import atomic_write_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# The canary audit's results, in the audit's own run directory (`fedveil privacy audit`).
AUDIT_FILE = Path("privacy") / "audit.json"


def ledger_path(run_dir: Path) -> Path:
    return Path(run_dir) / "privacy" / "ledger.jsonl"


def audit_of(run_dir: Path) -> dict[str, Any] | None:
    """report.json's `audit` section from the run's privacy/audit.json (None without one).

    Raises ValueError naming the file when it is unreadable or not a JSON object."""
    path = Path(run_dir) / AUDIT_FILE
    if not path.exists():
        return None
    try:
        audit = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: unreadable ({error})") from error
    if not isinstance(audit, dict):
        raise ValueError(f"{path}: not a JSON object (a canary audit's results)")
    return audit_section(audit)


# A secure all-reduce run (no coordinator): one signed ledger per silo, and the silos'
# identity public keys they were signed with (a roster, `fedveil identity roster`'s format).
SILOS_DIR = "silos"


def silo_ledger_path(run_dir: Path, silo: int) -> Path:
    return Path(run_dir) / SILOS_DIR / str(silo) / "ledger.jsonl"


def silo_roster_path(run_dir: Path) -> Path:
    return Path(run_dir) / SILOS_DIR / "roster.json"


def silo_ledgers(run_dir: Path) -> dict[int, Path]:
    """Each silo's ledger under silos/<id>/ (a folder whose name is no silo id: refused)."""
    found: dict[int, Path] = {}
    for child in sorted((Path(run_dir) / SILOS_DIR).iterdir()):
        if not child.is_dir():
            continue
        if not (child.name.isascii() and child.name.isdigit()):
            raise ValueError(f"{child}: a folder under {SILOS_DIR}/ that names no silo id")
        if (child / "ledger.jsonl").exists():
            found[int(child.name)] = child / "ledger.jsonl"
    return found


def verify_silo_run(run_dir: Path, silo_keys: str | Path | None = None) -> VerifyResult:
    """Every silo's ledger against its key, and the silos' agreement
    (privacy/dp/silo_verify.py). The keys: the roster `silo_keys` when given (only those
    keys), else the one pinned in the run directory (silos/roster.json)."""
    source = Path(silo_keys) if silo_keys is not None else silo_roster_path(run_dir)
    flag = "--silo-keys" if silo_keys is not None else "pinned silo keys"
    if silo_keys is None and not source.exists():
        return VerifyResult(
            ok=False,
            message=f"{source}: no pinned silo keys; pass the silos' roster with --silo-keys",
        )
    try:
        keys = load_roster(source, flag)
        ledgers = silo_ledgers(run_dir)
    except (RosterError, ValueError, OSError) as error:
        return VerifyResult(ok=False, message=str(error))
    return verify_silo_ledgers(ledgers, dict(keys))


def audit_discrepancies(run_dir: Path) -> list[str]:
    """Where report.json's `audit` section is not the one privacy/audit.json gives (the
    ledger proves neither: this holds the report to the audit it was written from)."""
    report_path = Path(run_dir) / "privacy" / "report.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        return []  # absent or unreadable: published_discrepancies names it
    try:
        expected = audit_of(run_dir)
    except ValueError as error:
        return [str(error)]
    shown = report.get("audit") if isinstance(report, dict) else None
    audit_path = Path(run_dir) / AUDIT_FILE
    if shown is None and expected is None:
        return []
    if expected is None:
        return [f"{report_path}: an audit section, but there is no {audit_path}"]
    if not isinstance(shown, dict):
        return [
            f"{report_path}: audit = {shown!r}, but {audit_path} holds a canary audit "
            "(rewrite the report with `fedveil privacy report`)"
        ]
    expected = json.loads(json.dumps(expected))
    return [
        f"{report_path}: audit.{key} = {json.dumps(shown.get(key))[:120]}, but {audit_path} "
        f"gives {json.dumps(expected.get(key))[:120]}"
        for key in sorted(set(shown) | set(expected))
        if shown.get(key) != expected.get(key)
    ]


def write_privacy_report(run_dir: str | Path, config: DpConfig | None = None) -> dict[str, Any]:
    """Verify the ledger, then write privacy/report.json and privacy/report.html, with the
    saved attacks and the canary audit (privacy/audit.json) where the run has them.

    `config` lets a run that stopped before its first release (budget too small
    for even one round) still get a report saying so. The operator's private annex
    (private/rounds.jsonl) never reaches the public files: they come from the ledger
    alone, so they are the same whoever took part. With the annex, the operator's report
    (each client's epsilon against the coordinator, noise-only rounds) goes to private/.
    """
    run_dir = Path(run_dir)
    path = ledger_path(run_dir)
    # Attack results saved under privacy/attacks/ (`fedveil privacy attack ... --out`).
    attacks = attacks_section(path.parent / ATTACKS_DIR)
    audit = audit_of(run_dir)
    if not path.exists() and config is None:
        if (run_dir / SILOS_DIR).is_dir():  # a secure all-reduce run: one ledger per silo
            return write_silo_report(run_dir, attacks)
        if attacks is not None or audit is not None:
            # A run without DP: a report of its attacks and canary audit alone.
            return write_attacks_only_report(path.parent, attacks, audit)
        raise FileNotFoundError(f"{path}: no privacy ledger (was the run made with --dp?)")
    entries: list[dict[str, Any]] = []
    verification = None
    if path.exists():
        verification = verify_ledger(path)
        # Every entry: build_report composes the releases and reads the closing record.
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    report, laid_out = public_report(run_dir, entries, verification, config)
    if not laid_out:  # a DP-SGD-only run: its ledger opens and closes, no release
        return _write_public(path.parent, report, attacks, audit)
    _add_unrebuilt(report, attacks, audit)
    # Public files, like the ledger: readable by an auditor (atomic writes default to 600).
    data = (json.dumps(report, indent=2) + "\n").encode()
    atomic_write_bytes(path.parent / "report.json", data, mode=0o644)
    atomic_write_bytes(
        path.parent / "report.html", report_page(report, path.parent).encode(), mode=0o644
    )
    annex = private_annex(run_dir)
    if annex is not None:
        write_operator_report(run_dir, report, entries, annex)
    return report


def public_report(
    run_dir: Path,
    entries: list[dict[str, Any]],
    verification: VerifyResult | None,
    config: DpConfig | None = None,
) -> tuple[dict[str, Any], bool]:
    """The public report of `entries` (the run's ledger, or a prefix of it) without its
    attacks, and whether render_html lays it out (False: a DP-SGD-only run's ledger,
    shown as plain JSON). `verify_run` rebuilds it to check report.json against."""
    if config is None:
        only = ledger_only_report(entries, verification)
        if only is not None:
            return only, False
    run_config = _run_config(run_dir)
    dp_section = run_config.get("dp", {}) if isinstance(run_config.get("dp"), dict) else {}
    report = build_report(
        entries,
        config=config,
        verification=verification,
        secure_aggregation=secure_aggregation_mode(run_dir),
        cohort_source=cohort_source(run_dir, dp_section),
        budget_against=dp_section.get("budget_against"),
    )
    return report, True


def _add_unrebuilt(
    report: dict[str, Any], attacks: dict[str, Any] | None, audit: dict[str, Any] | None
) -> None:
    """Join the sections not rebuilt from the ledger (published_figures' `_NOT_REBUILT`)."""
    if attacks is not None:
        report["attacks"] = attacks
    if audit is not None:
        report["audit"] = audit


def _join_unrebuilt(page: str, report: dict[str, Any], privacy_dir: Path) -> str:
    """`page` with the report's attacks' part, then its canary audit's, when it has them."""
    attacks = report.get("attacks")
    if isinstance(attacks, dict):
        page = join_attacks(page, attacks, privacy_dir)
    audit = report.get("audit")
    if isinstance(audit, dict):
        page = join_audit(page, audit)
    return page


def report_page(report: dict[str, Any], privacy_dir: Path) -> str:
    """report.html of a report render_html lays out, with its attacks' part and its
    canary audit's (after the attacks) when it has them."""
    return _join_unrebuilt(render_html(report), report, privacy_dir)


def plain_page(report: dict[str, Any], privacy_dir: Path) -> str:
    """report.html of a report render_html does not lay out: its JSON, its attacks and its
    canary audit."""
    shown = {k: v for k, v in report.items() if k != "audit"}
    body = f"<h1>Privacy report</h1><pre>{html.escape(json.dumps(shown, indent=2))}</pre>"
    return _join_unrebuilt(body, report, privacy_dir)


def write_silo_report(run_dir: Path, attacks: dict[str, Any] | None) -> dict[str, Any]:
    """privacy/report.json/html of a secure all-reduce run, from the silos' ledgers once
    each verifies against its pinned key and they agree (`verify_silo_run`)."""
    verification = verify_silo_run(run_dir)
    entries: list[dict[str, Any]] = []
    silos: list[int] = []
    if verification.ok:  # read only what verified; a failed run directory may not parse
        ledgers = silo_ledgers(run_dir)
        silos = sorted(ledgers)
        lines = ledgers[silos[0]].read_text().splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
    summary_path = Path(run_dir) / "summary.json"
    trust_model = None
    if summary_path.exists():
        try:
            trust_model = json.loads(summary_path.read_text()).get("trust_model")
        except (OSError, ValueError, AttributeError):
            trust_model = None
    report = silo_run_report(entries, verification, silos, trust_model)
    privacy_dir = Path(run_dir) / "privacy"
    privacy_dir.mkdir(parents=True, exist_ok=True)
    return _write_public(privacy_dir, report, attacks, audit_of(run_dir))


def _write_public(
    privacy_dir: Path,
    report: dict[str, Any],
    attacks: dict[str, Any] | None,
    audit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """report.json and a plain report.html of a report render_html does not lay out."""
    _add_unrebuilt(report, attacks, audit)
    data = (json.dumps(report, indent=2) + "\n").encode()
    atomic_write_bytes(privacy_dir / "report.json", data, mode=0o644)
    atomic_write_bytes(
        privacy_dir / "report.html", plain_page(report, privacy_dir).encode(), mode=0o644
    )
    return report


def write_attacks_only_report(
    privacy_dir: Path, attacks: dict[str, Any] | None, audit: dict[str, Any] | None = None
) -> dict[str, Any]:
    """report.json/html of a run with no privacy ledger: its attacks and canary audit
    alone."""
    report: dict[str, Any] = {}
    _add_unrebuilt(report, attacks, audit)
    privacy_dir.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(report, indent=2) + "\n").encode()
    atomic_write_bytes(privacy_dir / "report.json", data, mode=0o644)
    page = _join_unrebuilt("", report, privacy_dir)
    atomic_write_bytes(privacy_dir / "report.html", page.encode(), mode=0o644)
    return report


def write_operator_report(
    run_dir: Path,
    report: dict[str, Any],
    entries: list[dict[str, Any]],
    annex: list[dict[str, Any]],
) -> dict[str, Any]:
    """private/report.json and report.html (mode 600): the public report plus what the
    private annex shows: each client's epsilon against the coordinator (distributed DP)
    and the rounds released as noise only."""
    full = operator_report(report, annex, entries)
    private = Path(run_dir) / "private"
    data = (json.dumps(full, indent=2) + "\n").encode()
    atomic_write_bytes(private / "report.json", data, mode=0o600)
    atomic_write_bytes(private / "report.html", render_html(full).encode(), mode=0o600)
    return full


def cohort_source(run_dir: Path, dp_section: dict[str, Any] | None = None) -> str | None:
    """ "csprng" or "seed": summary.json's record, else dp.seeded_cohorts in config.toml
    (None when neither says)."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    recorded = summary.get("cohort_source") if isinstance(summary, dict) else None
    if recorded in ("csprng", "seed"):
        return str(recorded)
    section = dp_section if dp_section is not None else _run_config(run_dir).get("dp", {})
    if isinstance(section, dict) and "seeded_cohorts" in section:
        return "seed" if section["seeded_cohorts"] else "csprng"
    return None


def private_annex(run_dir: Path) -> list[dict[str, Any]] | None:
    """The operator's private round records (None where absent or unreadable: an
    auditor's copy of the run has only the public files)."""
    path = Path(run_dir) / "private" / "rounds.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line (crash mid-append); the ledger still has its charge
        if isinstance(record, dict):
            records.append(record)
    return records


def _run_config(run_dir: Path) -> dict[str, Any]:
    try:
        values = tomllib.loads((Path(run_dir) / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return values


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


def _model_binding(entries: list[dict[str, Any]]) -> str:
    """What verify says of the model file (already checked against the ledger)."""
    bound = bound_model_sha256(entries)
    if bound is not None:
        return f"{MODEL_FILE} matches the closing record's model_sha256 {bound}"
    return (
        f"the model is not bound: the ledger's closing record names no model_sha256, so "
        f"{MODEL_FILE} is not checked against it"
    )


def verify_run(
    run_dir: str | Path,
    *,
    public_key: bytes | None = None,
    witnesses: Sequence[str | Path] = (),
    second_accountants: Sequence[str] = (),
    silo_keys: str | Path | None = None,
) -> VerifyResult:
    """Verify the run's ledger independently (status final / interrupted / failed).

    A secure all-reduce run has no coordinator's ledger but one per silo (silos/): each
    is verified against its silo's key, and the silos must agree (`verify_silo_run`).

    The public key is `public_key` when given, else found by key id in the local key
    store. Each witness file holds ledger heads a device saw; every one must be in
    the chain. report.json's head hash, when present, is an anchor: the chain must
    contain it (a resumed run may have grown past it, a rolled-back one lacks it).
    """
    run_dir = Path(run_dir)
    path = ledger_path(run_dir)
    if not path.exists() and (run_dir / SILOS_DIR).is_dir():
        return verify_silo_run(run_dir, silo_keys)
    if silo_keys is not None:
        return VerifyResult(
            ok=False, message=f"--silo-keys {silo_keys}: {run_dir} has no silos' ledgers"
        )
    if not path.exists():
        return VerifyResult(ok=False, message=f"{path}: no privacy ledger")
    heads: list[dict[str, Any]] = []
    for witness in witnesses:
        try:
            seen = read_witness_file(witness)
        except (OSError, ValueError) as error:
            return VerifyResult(ok=False, message=f"witness file {witness}: {error}")
        if not seen:  # asked to check against it: an OK that checked nothing would mislead
            return VerifyResult(
                ok=False,
                message=f"witness file {witness}: holds no ledger head (nothing to check the "
                "chain against)",
            )
        heads.extend(seen)
    anchors: list[str] = []
    anchor = path.parent / "report.json"
    if anchor.exists():
        try:
            head = json.loads(anchor.read_text()).get("ledger_head_hash")
        except (OSError, ValueError, AttributeError) as error:
            return VerifyResult(ok=False, message=f"{anchor}: unreadable ({error})")
        if isinstance(head, str):
            anchors.append(head)
    result = verify_ledger(
        path,
        accountant=tuple(second_accountants) or None,
        anchors=anchors,
        public_key=public_key,
        witnesses=heads,
    )
    if result.status == STATUS_FAILED:
        return result
    # The ledger holds; now what the run directory shows beside it must be what it proves.
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    problems = published_discrepancies(
        run_dir,
        entries,
        build=lambda prefix, verified: public_report(run_dir, prefix, verified),
        render=lambda report, laid_out: (report_page if laid_out else plain_page)(
            report, path.parent
        ),
        verify_prefix=lambda prefix: verify_ledger(prefix, public_key=public_key),
    )
    problems += audit_discrepancies(run_dir)
    if not problems:
        return replace(result, message=f"{result.message}; {_model_binding(entries)}")
    return replace(
        result,
        ok=False,
        status=STATUS_FAILED,
        message="the run directory shows figures its ledger does not prove: "
        + "; ".join(problems)
        + f" (the ledger itself verifies: {result.message})",
    )
