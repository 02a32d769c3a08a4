"""A run's per-round records: the public view, and the operator's view (admin token).

Without DP both views are metrics.jsonl as the engine wrote it, drop reasons
included. Under DP the public view keeps only the keys a DP run may publish
(publication.py); the operator's view is the private annex (private/rounds.jsonl):
counts, drops by reason, cohorts.

Both are read a page at a time: `since` (the last round the caller has; rounds after
it are answered) and `limit` (at most MAX_ROUNDS_PAGE records), through the
service's RoundIndex (round_index.py), so a poll costs its page, not the run's length.
The whole history is reached page by page: since=0, then since=<last round received>,
until a page holds fewer than `limit` records.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter

from fedveil.server.coordinator.publication import public_record, run_is_dp
from fedveil.server.coordinator.routes.deps import ADMIN, ApiError, ServiceDep, run_or_404

router = APIRouter(tags=["runs"])

PRIVATE_ROUNDS = "private/rounds.jsonl"
METRICS_FILE = "metrics.jsonl"
MAX_ROUNDS_PAGE = 1000  # records a page holds at most (a few hundred bytes each)


def with_drop_counts(record: dict[str, Any]) -> dict[str, Any]:
    """`drops_by_reason` ({check: clients}) as the engine records it; for records written
    before it did, counted from the per-client reasons of the private annex."""
    reasons = record.get("dropped_reasons")
    if "drops_by_reason" in record or not isinstance(reasons, dict):
        return record
    return {**record, "drops_by_reason": dict(Counter(str(v) for v in reasons.values()))}


def page_bounds(since: int, limit: int) -> None:
    """ApiError (422) naming `since` or `limit` when out of range."""
    if not since >= 0:
        raise ApiError(422, f"since = {since}: must be >= 0 (the last round you have)", "since")
    if not 1 <= limit <= MAX_ROUNDS_PAGE:
        raise ApiError(
            422, f"limit = {limit}: must be in [1, {MAX_ROUNDS_PAGE}] records a page", "limit"
        )


@router.get(
    "/runs/{run_id}/rounds",
    summary="Per-round records after round `since`, at most `limit` (under DP: status, "
    "evaluation and accounted figures only)",
)
def rounds(
    run_id: str, service: ServiceDep, since: int = 0, limit: int = MAX_ROUNDS_PAGE
) -> list[dict[str, Any]]:
    page_bounds(since, limit)
    path = run_or_404(service, run_id)
    dp = run_is_dp(path)
    page = service.public_rounds.page(path / METRICS_FILE, since, limit)
    return [public_record(r, dp) for r in page]


@router.get(
    "/runs/{run_id}/rounds/private",
    summary="The operator's per-round records after round `since`, at most `limit`: "
    "counts, drops by reason, cohorts (admin)",
    dependencies=ADMIN,
)
def rounds_private(
    run_id: str, service: ServiceDep, since: int = 0, limit: int = MAX_ROUNDS_PAGE
) -> list[dict[str, Any]]:
    page_bounds(since, limit)
    path = run_or_404(service, run_id)
    if run_is_dp(path):
        page = service.private_rounds.page(path / PRIVATE_ROUNDS, since, limit)
    else:
        page = service.public_rounds.page(path / METRICS_FILE, since, limit)
    return [with_drop_counts(r) for r in page]
