"""DP on the server: budget check before a round, charge and ledger entry, release.

Central DP (DP-FedAvg, McMahan et al. 2018): clients clip their update to L2 norm C
and send it with weight 1; the server adds N(0, (zC)^2) to the sum, writes the
release to the ledger (durably) and only then publishes sum / expected cohort. The
coordinator sees the sum before the noise: it is a trusted curator, and no epsilon
holds against it. With adaptive clipping the count of unclipped clients is noised
too and moves C toward the target quantile (Andrew et al. 2021).

Distributed DP: clients add Skellam noise shares under secure aggregation, so the
sum is noised before anyone sees it. Every unmasking is charged first: the survivor
check (honest shares >= the plan's minimum) and the ledger entry come before the
first unmasking request (`before_unmask`), and the charge counts against both the
observers of the published models and, per client and unamplified, the coordinator.

Two adversaries, two epsilons: `epsilon()` is the observers' (amplified by sampling,
valid while cohorts are secret). Against the coordinator and cohort members,
`coordinator_bound()` is the unamplified epsilon of a client in every released round:
a function of the public ledger alone, so it is what public files (ledger, metrics,
summary) state and what `dp.budget_against = "coordinator"` caps. The realised
`coordinator_epsilon()` (the busiest client's participations) reveals how often clients
took part: it goes to the operator's private annex only (docs/explanation/trust-model.md).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig
from fedveil.privacy.dp import (
    Ledger,
    PrivacyBudget,
    add_gaussian_noise,
    next_clip_norm,
    noised_count,
)
from fedveil.privacy.dp.accounting import individual_epsilon
from fedveil.privacy.dp.adversaries import coordinator_bound_after
from fedveil.privacy.dp.plan import DistributedDpPlan, cohorts_are_secret, dp_config
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.privacy.secagg import SecAggAborted
from fedveil.protocol import fields as F
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.ledger_opening import open_ledger, request_head
from fedveil.server.engine.requests import ClientPrivacy
from fedveil.server.engine.sampling import cohort_commitment

log = logging.getLogger("fedveil.privacy")

# A private record sink: the run's operator-only annex (RunStore.append_private).
PrivateSink = Callable[[dict[str, Any]], None]


@dataclass
class Release:
    """An update the engine may apply, with the figures the round's record shows."""

    update: torch.Tensor
    metrics: dict[str, Any]


class CentralDP:
    adversary_note = (
        "central DP: the coordinator sees the un-noised sum (a trusted curator); "
        "no epsilon holds against it"
    )

    def __init__(
        self,
        cfg: RunConfig,
        num_clients: int,
        ledger_path: Path,
        *,
        run_id: str | None = None,
        signer: LedgerSigner | None = None,
        private: PrivateSink | None = None,
        participations: Mapping[int, int] | None = None,
        cohort_key: bytes | None = None,
    ) -> None:
        self.config = dp_config(cfg, num_clients)
        s = cfg.server
        # Divide by the expected cohort, never by the number that arrived (not private).
        self.expected_cohort = (
            s.per_round if s.sampling == "fixed" else cfg.poisson_rate * num_clients
        )
        self.cohorts_secret = cohorts_are_secret(cfg)
        # The secret cohorts (and secure-aggregation graphs) are drawn from; its SHA-256
        # commitment opens the ledger. Kept only in the run's private directory.
        self.cohort_key = cohort_key if cohort_key is not None else secrets.token_bytes(32)
        self.cohort_commitment = cohort_commitment(self.cohort_key) if self.cohorts_secret else None
        self.budget_against = cfg.dp.budget_against
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(ledger_path, run_id=run_id, signer=signer)
        # Signed before round 1: devices pin its key and check every head against it.
        open_ledger(self.ledger, cfg, self.cohort_commitment)
        self.budget = PrivacyBudget.from_ledger(self.config, self.ledger.releases)
        self.private = private
        self.participations: dict[int, int] = dict(participations or {})
        releases = self.ledger.releases
        self.clip = (
            float(releases[-1].get("next_clip_norm", self.config.clip_norm))
            if releases
            else self.config.clip_norm
        )

    @property
    def last_round(self) -> int:
        """The training round of the last release (ledger rounds count releases)."""
        releases = self.ledger.releases
        return int(releases[-1].get("training_round", releases[-1]["round"])) if releases else 0

    def epsilon(self) -> float:
        """The observers' epsilon: what the published models and run files reveal."""
        return self.budget.spent()

    def coordinator_epsilon(self) -> float | None:
        """None: under central DP nothing bounds what the coordinator learns."""
        return None

    def coordinator_bound(self) -> float | None:
        """None: under central DP nothing bounds what the coordinator learns."""
        return None

    def admits_next_round(self) -> tuple[bool, float]:
        """(allowed, epsilon after the round) — checked BEFORE a round runs."""
        eps = self.budget.epsilon_after(self.config.round_event())
        return eps <= self.config.budget_epsilon, eps

    def client_fields(self) -> ClientPrivacy:
        """This stage's part of the training request."""
        return ClientPrivacy(
            clip_norm=self.clip,
            weighting=F.WEIGHT_UNIFORM,
            clip_indicator=self.config.adaptive_clipping,
            # Devices verify and keep the heads they saw: witnesses against a rewritten
            # ledger, from round 1 on (the opening record is always there).
            ledger_head=request_head(self.ledger),
        )

    def release(self, round_num: int, agg: Aggregate | None, model_size: int) -> Release | None:
        """Noise the sum, write the ledger entry, return the update to publish.

        `agg` None (nobody arrived, or an empty Poisson cohort) still releases noise:
        the accountant charges every round the sampling scheme ran. Central DP never
        returns None; the type is the release step's for every mechanism, because
        `DistributedDP.release` returns None when the round published nothing.
        """
        total = torch.zeros(model_size) if agg is None else agg.total.detach().cpu()
        noised = add_gaussian_noise(total.numpy(), self.config.update_noise_multiplier, self.clip)
        extra: dict[str, Any] = {}
        next_clip = self.clip
        if self.config.adaptive_clipping:
            unclipped = 0.0 if agg is None else agg.extras.get(F.UNCLIPPED, 0.0)
            count = noised_count(unclipped, self.config.count_stddev)
            next_clip = next_clip_norm(
                self.clip,
                count,
                self.expected_cohort,
                self.config.target_quantile,
                self.config.clip_learning_rate,
            )
            extra["next_clip_norm"] = next_clip
        entry = self._charge(round_num, self.config.round_event(), self.clip, extra)
        metrics = {
            "epsilon": entry["epsilon"],
            "clip_norm": self.clip,
            "noise_multiplier": self.config.noise_multiplier,
        }
        self.clip = next_clip
        return Release(torch.from_numpy(noised) / self.expected_cohort, metrics)

    def _charge(
        self, round_num: int, event: Any, clip: float, extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        fields = {"training_round": round_num, "budget_against": self.budget_against, **extra}
        if not len(self.ledger) and self.cohort_commitment is not None:
            fields["cohort_commitment"] = self.cohort_commitment
        return self.budget.record_release(
            self.ledger,
            round_number=self.ledger.last_round + 1,
            event=event,
            clip_norm=clip,
            extra=fields,
        )

    def close(self, kind: str, training_round: int, reason: str | None = None) -> None:
        """The ledger's signed closing record: 'final' or 'interrupted' (a resume goes on)."""
        if self.ledger.closed:
            return  # a finished run's ledger takes nothing more (a resume of a done run)
        fields: dict[str, Any] = {"training_round": training_round, "epsilon": self.epsilon()}
        bound = self.coordinator_bound()
        if bound is not None:  # public: the ledger's parameters alone give it
            fields["epsilon_coordinator_bound"] = bound
        if reason:
            fields["reason"] = reason
        entry = self.ledger.close(kind, fields)
        realised = self.coordinator_epsilon()
        if realised is not None and self.private is not None:
            # The busiest client's figure counts participations: the operator's only.
            self.private(
                {
                    "kind": "close",
                    "ledger_kind": kind,
                    "ledger_seq": entry.get("seq"),
                    "training_round": training_round,
                    "epsilon_coordinator_max": realised,
                }
            )


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

    def _event(self) -> Any:
        assert self.plan is not None, "bind(plan) first"
        return self.config.round_event(self.plan.noise_multiplier)

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
        plan = self.plan
        assert plan is not None, "bind(plan) first"
        if len(survivors) < plan.min_survivors:
            raise SecAggAborted(
                f"{len(survivors)} survivors < {plan.min_survivors} (at least "
                f"{plan.min_honest} honest noise shares after up to {plan.corrupt} corrupt "
                "clients): too little noise to unmask; nothing unmasked"
            )
        allowed, eps = self.admits_next_round()
        if not allowed:
            raise SecAggAborted(
                f"unmasking would bring epsilon to {eps:.4g} > budget "
                f"{self.config.budget_epsilon:g}; nothing unmasked"
            )
        for cid in survivors:
            self.participations[cid] = self.participations.get(cid, 0) + 1
        extra = {
            "skellam": plan.params.to_dict(),
            "noise_shares": plan.min_honest,
            "epsilon_coordinator_bound": self.coordinator_bound(upcoming=1),
        }
        entry = self._charge(round_num, self._event(), self.config.clip_norm, extra)
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
