"""The steps of one round that need no engine state, as functions of the round's data.

`RoundEngine.run_round` (rounds.py) is the sequence: draw cohort -> build request ->
collect (the update channel) -> account drops -> release -> apply -> evaluate ->
report -> persist. What the channel hands back becomes a `Collected`; the drops are
counted on the record (`account_drops`); without DP the release is the plain mean
(`plain_release`); `persist` writes the record where the run's trust model says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fedveil.server.engine.aggregation import Aggregate, NoUpdates
from fedveil.server.engine.drops import drops_by_reason, failure_summary
from fedveil.server.engine.release_mechanism import Release
from fedveil.server.engine.round_record import RoundRecord
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.unmask_gate import Aborted

log = logging.getLogger("fedveil.server")


@dataclass(frozen=True)
class Collected:
    """What the collect step ended with: the sum (`agg`), or an abort, or neither (no
    update arrived, or an empty cohort); and why each dropped client dropped."""

    agg: Aggregate | None = None
    aborted: Aborted | None = None
    dropped: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, outcome: Aggregate | Aborted | NoUpdates | None) -> Collected:
        if isinstance(outcome, Aggregate):
            return cls(agg=outcome, dropped=outcome.dropped)
        if isinstance(outcome, Aborted):
            return cls(aborted=outcome, dropped=outcome.dropped)
        if isinstance(outcome, NoUpdates):
            return cls(dropped=outcome.dropped)
        return cls()


def account_drops(record: RoundRecord, cohort: list[int], got: Collected, *, dp: bool) -> None:
    """The round's counts, its drops per reason and, after an abort, where it fell;
    one log line with the distinct reasons. Under DP (`dp`) the counts, and who dropped,
    are the operator's alone: the record's private annex and the debug log."""
    if got.agg is not None:
        record.dropped = len(got.agg.dropped)
        record.cohort_aggregated = len(got.agg.contributors)
    else:
        record.dropped = len(cohort)
    record.extra["drops_by_reason"] = drops_by_reason(got.dropped)
    if got.aborted is not None:
        # Aborted before unmasking: nothing revealed, applied or charged. After it: the
        # sum may have been seen; under distributed DP it was charged first.
        record.extra.update(status="aborted", aborted_stage=got.aborted.stage)
        record.extra["abort_reason"] = got.aborted.reason
    summed = frozenset(got.agg.contributors) if got.agg is not None else frozenset()
    log_drops(record.round, len(cohort), got.dropped, dp=dp, summed=summed)


SUMMED_NOTE = " (its update is in the sum)"


def log_drops(
    round_num: int,
    cohort_size: int,
    dropped: dict[int, str],
    *,
    dp: bool,
    summed: frozenset[int] = frozenset(),
) -> None:
    """One warning per round, not one per client: "round 3: 20 of 20 clients failed:
    20 x RuntimeError: ...". Under DP it names the distinct reasons without counts or
    ids; the counts go to the debug log. Per-client lines are below the default level:
    info (`-v`, the deployed server.log), under DP debug only. A dropped client whose
    update is in the round's sum (`summed`: secure aggregation's client that dropped
    after its masked input) is marked SUMMED_NOTE: who the sum covers, without DP,
    is then in the log (benchmarks/fleet_secagg_round.py reads it)."""
    per_client = logging.DEBUG if dp else logging.INFO
    for cid, reason in sorted(dropped.items()):
        note = SUMMED_NOTE if cid in summed else ""
        log.log(per_client, "round %d: client %d dropped: %s%s", round_num, cid, reason, note)
    if not dropped:
        return
    counted = failure_summary(dropped, counts=True)
    if dp:
        log.warning(
            "round %d: clients failed: %s", round_num, failure_summary(dropped, counts=False)
        )
        log.debug(
            "round %d: %d of %d clients failed: %s", round_num, len(dropped), cohort_size, counted
        )
    else:
        log.warning(
            "round %d: %d of %d clients failed: %s", round_num, len(dropped), cohort_size, counted
        )


def plain_release(got: Collected, min_clients: int) -> Release | None:
    """Without DP the release is the contributors' mean, when at least `min_clients`
    contributed; None: nothing to apply."""
    agg = got.agg
    if agg is None or len(agg.contributors) < min_clients:
        return None
    return Release(agg.mean, {})


def persist(store: RunStore, record: RoundRecord, annex: dict[str, Any] | None) -> None:
    """The round's durable line. Without DP (`annex` None) it is public whole. Under DP
    metrics.jsonl gets the accounted figures only (`public_json`); the whole record and
    the scheduler's `annex` (a sync round's cohort, survivors and every drop reason) go
    to the operator's private annex."""
    if annex is None:
        store.append_metrics(record.to_json())
        return
    private = record.to_json()
    private.update(annex)
    store.append_private(private)
    store.append_metrics(record.public_json())
