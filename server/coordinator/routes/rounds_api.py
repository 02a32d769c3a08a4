"""A run's per-round records: the public view, and the operator's view (admin token).

Without DP both views are metrics.jsonl as the engine wrote it, drop reasons
included. Under DP the public view keeps only the keys a DP run may publish
(publication.py); the operator's view is the private annex (private/rounds.jsonl):
counts, drops by reason, cohorts.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import APIRouter

from fedveil.server.coordinator.publication import public_record, run_is_dp
from fedveil.server.coordinator.routes.deps import ADMIN, ServiceDep, run_or_404
from fedveil.server.coordinator.rundir import RunDir

router = APIRouter(tags=["runs"])

PRIVATE_ROUNDS = "private/rounds.jsonl"


def public_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """What anyone may read about each round."""
    dp = run_is_dp(run_dir)
    return [public_record(r, dp) for r in RunDir(run_dir.parent.parent, run_dir.name).metrics()]


def private_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """The operator's per-round records: the private annex under DP (charge records
    left out; one record per round, the last written), metrics.jsonl otherwise."""
    if not run_is_dp(run_dir):
        records = RunDir(run_dir.parent.parent, run_dir.name).metrics()
    else:
        by_round: dict[int, dict[str, Any]] = {}
        for record in _jsonl(run_dir / PRIVATE_ROUNDS):
            if record.get("kind") != "charge" and isinstance(record.get("round"), int):
                by_round[record["round"]] = record
        records = [by_round[r] for r in sorted(by_round)]
    return [with_drop_counts(r) for r in records]


def with_drop_counts(record: dict[str, Any]) -> dict[str, Any]:
    """`drops_by_reason` ({check: clients}) as the engine records it; for records written
    before it did, counted from the per-client reasons of the private annex."""
    reasons = record.get("dropped_reasons")
    if "drops_by_reason" in record or not isinstance(reasons, dict):
        return record
    return {**record, "drops_by_reason": dict(Counter(str(v) for v in reasons.values()))}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line (crash mid-append)
        if isinstance(record, dict):
            out.append(record)
    return out


@router.get(
    "/runs/{run_id}/rounds",
    summary="Per-round records (under DP: status, evaluation and accounted figures only)",
)
def rounds(run_id: str, service: ServiceDep, since: int = 0) -> list[dict[str, Any]]:
    path = run_or_404(service, run_id)
    return [r for r in public_rounds(path) if int(r.get("round", 0)) > since]


@router.get(
    "/runs/{run_id}/rounds/private",
    summary="The operator's per-round records: counts, drops by reason, cohorts (admin)",
    dependencies=ADMIN,
)
def rounds_private(run_id: str, service: ServiceDep, since: int = 0) -> list[dict[str, Any]]:
    path = run_or_404(service, run_id)
    return [r for r in private_rounds(path) if int(r.get("round", 0)) > since]
