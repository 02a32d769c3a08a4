"""Distributed DP for asynchronous training (server.mode = 'async' | 'ssp'): each secure-
aggregation group is one release, noised by the Skellam shares its members add.

One plan serves every group (privacy/dp/plan.py with the group of G as its cohort): the
threshold from the threat model for G, the fewest survivors a group may unmask
(`min_survivors`) and, after the corrupt members secagg.adversarial_rate allows, the
fewest honest shares (`min_honest`) every unmasked sum carries. The server and every
member compute it from the run config; a member refuses a server that sends other
Skellam parameters or asks it to unmask for fewer survivors (client/secagg_stages.py,
the same checks as in sync rounds).

Order, per group: its members' dispatches are counted durably (the participation cap,
async_privacy.py), the session runs, and right before the first unmasking request the
channel calls `before_unmask` (the UnmaskGate): fewer survivors than the plan's floor
abort the group (lost, never revealed, nothing charged); otherwise the signed ledger
entry is written (fsync'd) and only then does any unmasking request go out. The apply
adds no noise and writes no entry: it divides the staleness-weighted sum of the groups'
already-noised sums by server.buffer, post-processing that costs nothing.

Accounting, without amplification (nothing is sampled): a client is dispatched at most
P = server.max_participations times and each dispatch puts it in at most one group
release, so every client's epsilon is at most the P-fold composition of one release's
Skellam RDP at the plan's z (skellam_rdp_integer at q = 1). That bound is stated before the run
(refused over dp.epsilon) and is the same for the observers and the coordinator, which
sees only sums already carrying the honest shares; `coordinator_bound` states it from
the ledger alone. A crash after a group was charged but before the checkpoint leaves
it charged; on resume every unit in flight is recomputed as a new dispatch of its
members (AsyncEngine.restore), so the cap still bounds the releases a client is in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig
from fedveil.privacy.dp.adversaries import coordinator_bound_after
from fedveil.privacy.dp.async_plan import check_group_bound
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.dp.plan import DistributedDpPlan
from fedveil.privacy.secagg import SecAggAborted
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.async_privacy import AsyncCentralDP
from fedveil.server.engine.release_mechanism import Release

CHARGE = "charge"  # private-annex record kind: who a group release charged


class AsyncDistributedDP(AsyncCentralDP):
    """The dispatch gate (inherited), the unmask gate of every group, and the apply."""

    adversary_note = (
        "distributed DP, asynchronous: the coordinator sees only group sums already "
        "carrying the honest members' noise shares; any client's epsilon is at most that "
        "of server.max_participations group releases, unamplified"
    )
    charges_at_unmask = True

    def __init__(self, cfg: RunConfig, num_clients: int, ledger_path: Path, **kwargs: Any) -> None:
        super().__init__(cfg, num_clients, ledger_path, **kwargs)
        # Nothing is amplified: both adversaries' figures are the capped bound.
        self.budget_against = cfg.dp.budget_against
        self.plan: DistributedDpPlan | None = None

    def bind(self, plan: DistributedDpPlan) -> None:
        """The run's group plan (the one its clients compute too): the bound stated before
        the run is the cap's at the z of the plan's fewest honest shares."""
        self.bound = check_group_bound(self.config, plan)
        self.plan = plan

    def _plan(self) -> DistributedDpPlan:
        if self.plan is None:
            raise RuntimeError("AsyncDistributedDP.bind(plan) must come before any group")
        return self.plan

    def _event(self) -> PrivacyEvent:
        """One group release: its Gaussian-equivalent z at the plan's fewest honest shares."""
        return self.config.round_event(self._plan().noise_multiplier)

    # -------------------------------------------------------------- unmask gate
    def before_unmask(self, round_num: int, survivors: frozenset[int]) -> None:
        """Group `round_num` (its dispatch number) is about to be unmasked: refuse too few
        survivors (SecAggAborted: nothing unmasked, nothing charged), else write its
        signed ledger entry durably; the channel unmasks only after this returns."""
        plan = self._plan()
        if self.ledger.closed:
            raise SecAggAborted("the run's ledger is closed: nothing more is unmasked")
        if len(survivors) < plan.min_survivors:
            raise SecAggAborted(
                f"{len(survivors)} survivors < {plan.min_survivors} (at least "
                f"{plan.min_honest} honest noise shares after up to {plan.corrupt} corrupt "
                "members): too little noise to unmask; the group is lost, nothing unmasked"
            )
        event = self._event()
        extra: dict[str, Any] = {
            "budget_against": self.budget_against,
            "skellam": plan.params.to_dict(),
            "noise_shares": plan.min_honest,
            "epsilon_coordinator_bound": self.coordinator_bound(upcoming=1),
        }
        if not len(self.ledger) and self.cohort_commitment is not None:
            extra["cohort_commitment"] = self.cohort_commitment
        # Raises BudgetExceededError (nothing written, nothing unmasked) past dp.epsilon;
        # the cap's bound was checked before the run, so an honest run never does.
        entry = self.budget.record_release(
            self.ledger,
            round_number=self.ledger.last_round + 1,
            event=event,
            clip_norm=self.clip,
            extra=extra,
        )
        if self.private is not None:
            # Who a release charged: participation, so the operator's annex only (the
            # operator's report rebuilds each client's figure from it).
            self.private(
                {
                    "kind": CHARGE,
                    "dispatch": int(round_num),
                    "ledger_seq": entry.get("seq"),
                    "survivors": sorted(int(c) for c in survivors),
                }
            )

    # --------------------------------------------------------------- the apply
    def release(self, round_num: int, agg: Aggregate | None, model_size: int) -> Release:
        """Model version `round_num` from the buffered groups' sums (already noised and
        charged when unmasked): their sum / server.buffer (public), no noise and no
        ledger entry."""
        total = torch.zeros(model_size) if agg is None else agg.total
        metrics = {
            "epsilon": self.epsilon(),
            "epsilon_cap_bound": self.bound,
            "epsilon_coordinator_bound": self.coordinator_bound(),
            "clip_norm": self.clip,
            "noise_multiplier": self._event().noise_multiplier,
        }
        return Release(total / self.divisor, metrics)

    # ---------------------------------------------------------------- the figures
    @property
    def last_round(self) -> int:
        """0: releases are charged when a group is unmasked, never at the apply, so no
        model version can be on the ledger ahead of the checkpoint (on resume the engine
        recounts every unit in flight instead; AsyncEngine.restore)."""
        return 0

    def coordinator_bound(self, upcoming: int = 0) -> float:
        """The coordinator's figure from the public ledger alone: a client in as many of
        the releases so far (plus `upcoming`) as the cap allows, unamplified."""
        events = [self._event()] * upcoming
        cap = self.config.max_participations
        return coordinator_bound_after(self.ledger.releases, self.config.delta, events, cap)

    def coordinator_epsilon(self) -> float:
        """The busiest client's figure (its dispatches): the operator's annex only."""
        return self.realised_epsilon()

    def admits_next_round(self) -> tuple[bool, float]:
        eps = self.budget.epsilon_after(self._event())
        return eps <= self.config.budget_epsilon, eps
