"""Distributed DP: clients add Skellam noise shares under secure aggregation, so the
sum is noised before anyone sees it; for sync rounds and for the secure-aggregation
groups of asynchronous training (the release mechanisms of release_mechanism.py).

Every unmasking is charged first: the survivor check (honest shares >= the plan's
minimum) and the ledger entry come before the first unmasking request
(`before_unmask`, the channel's UnmaskGate), and the charge counts against both the
observers of the published models and, per client and unamplified, the coordinator.
The release then adds no noise and writes no entry: it divides the already-noised sum
by a public constant (the expected cohort; the buffer K), post-processing that costs
nothing.

Sync rounds (`DistributedDP`): `epsilon()` is the observers' (amplified by sampling,
valid while cohorts are secret). Against the coordinator and cohort members,
`coordinator_bound()` is the unamplified epsilon of a client in every released round:
a function of the public ledger alone, so it is what public files (ledger, metrics,
summary) state and what `dp.budget_against = "coordinator"` caps. The realised
`coordinator_epsilon()` (the busiest client's participations) reveals how often clients
took part: it goes to the operator's private annex only (docs/explanation/trust-model.md).

Asynchronous training (`AsyncDistributedDP`, server.mode = 'async' | 'ssp'): each
secure-aggregation group is one release. One plan serves every group
(privacy/dp/plan.py with the group of G as its cohort): the threshold from the threat
model for G, the fewest survivors a group may unmask (`min_survivors`) and, after the
corrupt members secagg.adversarial_rate allows, the fewest honest shares (`min_honest`)
every unmasked sum carries. The server and every member compute it from the run
config; a member refuses a server that sends other Skellam parameters or asks it to
unmask for fewer survivors (client/secagg_stages.py, the same checks as in sync rounds).
Per group: its members' dispatches are counted durably (the participation cap,
central_release.AsyncCentralDP), the session runs, and right before the first unmasking
request the channel calls `before_unmask`: fewer survivors than the plan's floor abort
the group (lost, never revealed, nothing charged); otherwise the signed ledger entry is
written (fsync'd) and only then does any unmasking request go out.

Accounting, without amplification (nothing is sampled): a client is dispatched at most
P = server.max_participations times and each dispatch puts it in at most one group
release, so every client's epsilon is at most the P-fold composition of one release's
Skellam RDP at the plan's z (skellam_rdp_integer at q = 1). That bound is stated before
the run (refused over dp.epsilon) and is the same for the observers and the
coordinator, which sees only sums already carrying the honest shares; `coordinator_bound`
states it from the ledger alone. A crash after a group was charged but before the
checkpoint leaves it charged; on resume every unit in flight is recomputed as a new
dispatch of its members (BufferedScheduler.restore), so the cap still bounds the
releases a client is in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig
from fedveil.privacy.dp.accounting import individual_epsilon
from fedveil.privacy.dp.adversaries import coordinator_bound_after
from fedveil.privacy.dp.async_plan import check_group_bound
from fedveil.privacy.dp.distributed_plan import DistributedDpPlan
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.secagg import SecAggAborted
from fedveil.protocol import fields as F
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.central_release import AsyncCentralDP, CentralDP
from fedveil.server.engine.ledger_opening import request_head
from fedveil.server.engine.release_mechanism import Release
from fedveil.server.engine.requests import ClientPrivacy

CHARGE = "charge"  # private-annex record kind: who a group release charged


def bound_plan(plan: DistributedDpPlan | None, mechanism: str) -> DistributedDpPlan:
    """The plan `bind` gave the mechanism; refused before one was bound."""
    if plan is None:
        raise RuntimeError(f"{mechanism}.bind(plan) must come before any release")
    return plan


def refuse_too_few_survivors(
    plan: DistributedDpPlan, survivors: frozenset[int], who: str, lost: str = ""
) -> None:
    """The unmask gate's first check: fewer survivors than the plan's floor carry too
    few honest noise shares (SecAggAborted: nothing unmasked, nothing charged)."""
    if len(survivors) < plan.min_survivors:
        raise SecAggAborted(
            f"{len(survivors)} survivors < {plan.min_survivors} (at least "
            f"{plan.min_honest} honest noise shares after up to {plan.corrupt} corrupt "
            f"{who}): too little noise to unmask; {lost}nothing unmasked"
        )


def skellam_charge_fields(plan: DistributedDpPlan, coordinator_bound: float) -> dict[str, Any]:
    """What a distributed-DP ledger entry adds to the release's fields: the Skellam
    parameters, the honest shares every unmasked sum carries, the coordinator's bound."""
    return {
        "skellam": plan.params.to_dict(),
        "noise_shares": plan.min_honest,
        "epsilon_coordinator_bound": coordinator_bound,
    }


class DistributedDP(CentralDP):
    """Clients add the noise (Skellam shares under secure aggregation); the server checks
    the survivors and charges before unmasking, then releases the decoded sum."""

    adversary_note = (
        "distributed DP: the coordinator only sees sums that already carry the honest "
        "clients' noise shares; each client's epsilon counts its own participations, "
        "unamplified, and is at most that of a client in every released round"
    )

    def __init__(self, cfg: RunConfig, num_clients: int, ledger_path: Path, **kwargs: Any) -> None:
        super().__init__(cfg, num_clients, ledger_path, **kwargs)
        self.plan: DistributedDpPlan | None = None
        self._charged: dict[int, dict[str, Any]] = {}
        self._individual: dict[int, float] = {}

    def bind(self, plan: DistributedDpPlan) -> None:
        self.plan = plan

    def _event(self) -> PrivacyEvent:
        """One round's release: its Gaussian-equivalent z at the plan's fewest honest shares."""
        return self.config.round_event(bound_plan(self.plan, "DistributedDP").noise_multiplier)

    def _client_epsilon(self, participations: int) -> float:
        if participations not in self._individual:
            events = [self._event()] * participations
            self._individual[participations] = individual_epsilon(events, self.config.delta)
        return self._individual[participations]

    def coordinator_epsilon(self) -> float:
        """The realised worst client's epsilon (its participations): operator's only."""
        most = max(self.participations.values(), default=0)
        return self._client_epsilon(most) if most else 0.0

    def coordinator_bound(self, upcoming: int = 0) -> float:
        """The unamplified epsilon of a client in every released round (plus `upcoming`
        more): from the public ledger alone, whoever took part."""
        events = [self._event()] * upcoming
        return coordinator_bound_after(self.ledger.releases, self.config.delta, events)

    def admits_next_round(self) -> tuple[bool, float]:
        if self.budget_against == "coordinator":
            # The bound, not the busiest client's count: the stopping round must not
            # reveal how often anyone took part (conservative by design).
            eps = self.coordinator_bound(upcoming=1)
        else:
            eps = self.budget.epsilon_after(self._event())
        return eps <= self.config.budget_epsilon, eps

    def client_fields(self) -> ClientPrivacy:
        """This stage's part of the training request."""
        return ClientPrivacy(
            clip_norm=self.config.clip_norm,
            weighting=F.WEIGHT_UNIFORM,
            ledger_head=request_head(self.ledger),
        )

    def before_unmask(self, round_num: int, survivors: frozenset[int]) -> None:
        """The UnmaskGate: refuse too few honest shares, else charge durably, then unmask."""
        plan = bound_plan(self.plan, "DistributedDP")
        refuse_too_few_survivors(plan, survivors, "clients")
        allowed, eps = self.admits_next_round()
        if not allowed:
            raise SecAggAborted(
                f"unmasking would bring epsilon to {eps:.4g} > budget "
                f"{self.config.budget_epsilon:g}; nothing unmasked"
            )
        for cid in survivors:
            self.participations[cid] = self.participations.get(cid, 0) + 1
        extra = {
            "training_round": round_num,
            **skellam_charge_fields(plan, self.coordinator_bound(upcoming=1)),
        }
        entry = self._charge(self._event(), self.config.clip_norm, extra)
        if self.private is not None:
            # Who took part: the coordinator's epsilon per client is rebuilt from this.
            self.private(
                {
                    "round": round_num,
                    "kind": "charge",
                    "ledger_seq": entry.get("seq"),
                    "survivors": sorted(survivors),
                    "epsilon_coordinator_max": self.coordinator_epsilon(),
                }
            )
        # The realised figure travels with the charge to this round's (private) record.
        self._charged[round_num] = {**entry, "epsilon_coordinator_max": self.coordinator_epsilon()}

    def release(self, round_num: int, agg: Aggregate | None, model_size: int) -> Release | None:
        """The decoded, already-noised sum to publish; None when the round was aborted or
        nothing was unmasked (and so nothing charged): the engine then applies nothing."""
        entry = self._charged.pop(round_num, None)
        if agg is None or entry is None:
            return None  # aborted, or nothing unmasked: nothing to publish
        metrics = {
            "epsilon": entry["epsilon"],
            "epsilon_coordinator_bound": entry["epsilon_coordinator_bound"],
            # Realised, from participation counts: RoundRecord.public_json drops it, so
            # it reaches the private annex and the operator's views only.
            "epsilon_coordinator_max": entry["epsilon_coordinator_max"],
            "clip_norm": self.config.clip_norm,
            "noise_multiplier": entry["noise_multiplier"],
        }
        return Release(agg.total.detach().cpu() / self.expected_cohort, metrics)


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
        return bound_plan(self.plan, "AsyncDistributedDP")

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
        refuse_too_few_survivors(plan, survivors, "members", "the group is lost, ")
        # No training round: the group's release is applied with a later model version.
        extra = skellam_charge_fields(plan, self.coordinator_bound(upcoming=1))
        # Raises BudgetExceededError (nothing written, nothing unmasked) past dp.epsilon;
        # the cap's bound was checked before the run, so an honest run never does.
        entry = self._charge(self._event(), self.clip, extra)
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
        recounts every unit in flight instead; BufferedScheduler.restore)."""
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
