"""`fedveil privacy report|verify RUN_DIR`: audit what a run spent."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_privacy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("privacy", help="privacy reports and independent verification")
    psub = p.add_subparsers(dest="privacy_command", required=True, metavar="ACTION")
    rep = psub.add_parser(
        "report",
        help="write privacy/report.json and a self-contained privacy/report.html",
        description="Verify the run's privacy ledger, then write privacy/report.json and "
        "privacy/report.html (epsilon against the budget, clip norm, participation, "
        "and the trust assumptions in plain words).",
    )
    rep.add_argument("run_dir", help="a run directory made with --dp")
    rep.set_defaults(func=cmd_report)
    ver = psub.add_parser(
        "verify",
        help="recompute epsilon from the ledger; exit 1 at the first discrepancy",
        description="Recompute epsilon from the ledger's events independently of the stored "
        "numbers, check the hash chain, round order, budget and (when report.json exists) "
        "the ledger's length and head hash. Exits 0 when everything holds, 1 otherwise.",
    )
    ver.add_argument("run_dir")
    ver.set_defaults(func=cmd_verify)


def cmd_report(args: argparse.Namespace) -> int:
    from fedveil.server.privacy_report import write_privacy_report

    report = write_privacy_report(Path(args.run_dir))
    verdict = report.get("verification", {})
    print(
        f"epsilon {report['epsilon']:.4f} of budget {report['budget_epsilon']:g} "
        f"(delta {report['delta']:g}) over {report['rounds']} releases; "
        f"ledger {'verified' if verdict.get('ok') else 'FAILED: ' + str(verdict.get('message'))}"
    )
    print(f"wrote {Path(args.run_dir) / 'privacy' / 'report.html'}")
    return 0 if verdict.get("ok", False) else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from fedveil.server.privacy_report import verify_run

    ok, message = verify_run(Path(args.run_dir))
    print(("OK: " if ok else "FAIL: ") + message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1
