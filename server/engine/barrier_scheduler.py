"""The barrier (server.mode = sync): one cohort per round, and the round waits for it.

gather: draw the cohort (drawn one round ahead, so the update channel can prepare the
next one: secure aggregation's key stages) -> one training request to every member ->
the update channel's sum over the cohort -> the drops counted on the record. Under DP
a round runs only while the budget admits it (checked before the cohort is drawn); the
record's counts, the cohort and who dropped then go to the operator's private annex.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fedveil.config import RunConfig
from fedveil.server.engine.dpsgd_accounting import ClientDpSgdAccountant
from fedveil.server.engine.round_record import RoundRecord
from fedveil.server.engine.round_steps import Collected, account_drops
from fedveil.server.engine.scheduler import EngineView, Gathered

log = logging.getLogger("fedveil.server")


class BarrierScheduler:
    """sync rounds: the cohort's sum, as the update channel returns it."""

    mode = "sync"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        # Without DP the round needs at least this many updates (server.min_clients).
        self.min_contributors = cfg.server.min_clients
        # The next round's cohort, drawn one round ahead so the channel can prepare it
        # (secure aggregation's key stages); the draws and their order are unchanged.
        self.upcoming: list[int] | None = None
        self.dp_sgd: ClientDpSgdAccountant | None = None

    def attach(self, engine: EngineView) -> None:
        self.engine = engine
        self.dp_sgd = _dp_sgd_accountant(engine)

    def admits_next(self) -> bool:
        e = self.engine
        if e.privacy is None:
            return True
        allowed, eps = e.privacy.admits_next_round()
        if not allowed:
            e.stopped_reason = (
                f"privacy budget: round {e.round + 1} would bring epsilon "
                f"({e.privacy.budget_against}) to {eps:.4g} > budget "
                f"{e.privacy.config.budget_epsilon:g}; stopped"
            )
            log.warning(e.stopped_reason)
        return allowed

    def gather(self, round_num: int) -> Gathered:
        start = time.perf_counter()
        # Under any DP (DP-SGD alone included) the record's counts stay private.
        dp = self.cfg.publishes_privately
        cohort = self._draw_cohort(round_num)
        record = RoundRecord(round_num, len(cohort), 0, 0, applied=False)
        got = self._collect(round_num, cohort)
        account_drops(record, cohort, got, dp=dp)
        self._account_dp_sgd(record, got)
        if self.engine.first_client_error is None and got.dropped:
            self.engine.first_client_error = got.dropped[min(got.dropped)]
        return Gathered(record, got, start, _annex(cohort, got) if dp else None)

    def _draw_cohort(self, round_num: int) -> list[int]:
        """This round's cohort (drawn one round ahead when known) and the next one's."""
        sampler = self.engine.sampler
        cohort = self.upcoming if self.upcoming is not None else sampler.sample()
        self.upcoming = sampler.sample() if round_num < self.cfg.server.rounds else None
        return cohort

    def _collect(self, round_num: int, cohort: list[int]) -> Collected:
        """The training request to every cohort member, and the update channel's sum."""
        if not cohort:
            return Collected()
        e = self.engine
        request = e.train_request(round_num)
        requests = {cid: request for cid in cohort}
        timeout = self.cfg.server.round_timeout or None
        outcome = e.channel.collect(
            e.transport, requests, e.model.size, timeout, upcoming=self.upcoming
        )
        return Collected.of(outcome)

    def _account_dp_sgd(self, record: RoundRecord, got: Collected) -> None:
        # Simulation only (it knows every client's n): the busiest client's figure inverts
        # to its n, so it goes to the private annex (not in PUBLIC_UNDER_DP); devices
        # account their own (client/dpsgd_budget.py).
        if self.dp_sgd is not None and got.agg is not None:
            record.extra["dp_sgd_epsilon_max"] = self.dp_sgd.record_round(got.agg.contributors)

    def after_apply(self, record: RoundRecord) -> None:
        return None

    def begin(self) -> None:
        return None

    def end(self, failed: bool) -> None:
        return None

    def state(self) -> dict[str, Any]:
        return {"upcoming": self.upcoming}

    def restore(self, state: dict[str, Any]) -> None:
        upcoming = state.get("upcoming")  # absent in checkpoints of older versions
        self.upcoming = None if upcoming is None else [int(c) for c in upcoming]

    def summary(self) -> dict[str, Any]:
        return {}


def _annex(cohort: list[int], got: Collected) -> dict[str, Any]:
    """The operator's fields of a DP round: the cohort, the survivors, every drop reason."""
    annex: dict[str, Any] = {
        "cohort": cohort,
        "dropped_reasons": {str(c): r for c, r in got.dropped.items()},
    }
    if got.agg is not None:
        annex["survivors"] = list(got.agg.contributors)
    return annex


def _dp_sgd_accountant(engine: EngineView) -> ClientDpSgdAccountant | None:
    cfg, task = engine.cfg, engine.task
    if cfg.client.dp_sgd_noise <= 0 or task.client_sizes is None:
        return None
    return ClientDpSgdAccountant(
        cfg.client.dp_sgd_noise,
        cfg.client.batch_size,
        max(1, cfg.client.local_epochs),
        task.client_sizes,
        cfg.dp.delta,
    )
