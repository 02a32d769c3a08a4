"""Central DP: the server adds Gaussian noise to the sum, for sync rounds and for the
buffers of asynchronous training (the release mechanisms of release_mechanism.py).

Sync rounds (`CentralDP`; DP-FedAvg, McMahan et al. 2018): clients clip their update
to L2 norm C and send it with weight 1; the server adds N(0, (zC)^2) to the sum, writes
the release to the ledger (durably) and only then publishes sum / expected cohort. The
coordinator sees the sum before the noise: it is a trusted curator, and no epsilon
holds against it. With adaptive clipping the count of unclipped clients is noised
too and moves C toward the target quantile (Andrew et al. 2021).

Asynchronous training (`AsyncCentralDP`, server.mode = 'async' | 'ssp'): no sampling,
so no amplification: each release (one server update) is an unsampled Gaussian
mechanism, N(0, (zC)^2) added to a sum in which each client's update (re-clipped to C,
weight <= 1) appears at most once. The scheduler dispatches a client at most
server.max_participations P times (`dispatch` refuses the (P+1)-th, and counts each
dispatch durably in the private annex BEFORE it is sent, so a resume never forgets
one), so every client's epsilon is at most the P-fold composition
(fedveil.privacy.dp.participation): the public bound, stated before the run and
refused by async_plan when over dp.epsilon. The realised figure (the busiest client's
dispatches) counts participation: the private annex only. The release divides by the
buffer K (public).

Order in `release`, for both: noise, then the signed ledger entry (fsync'd), then the
update is returned for the engine to apply. A crash between the ledger entry and the
checkpoint leaves a release that is charged but never applied: it stays charged, and
the resumed run releases that version again under the next ledger round.

Two adversaries, two epsilons: `epsilon()` is the observers' (amplified by sampling,
valid while cohorts are secret). Against the coordinator and cohort members,
`coordinator_bound()` is the unamplified epsilon of a client in every released round
(distributed_release.py; None here: central DP's coordinator is trusted).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
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
from fedveil.privacy.dp.async_plan import stated_bound
from fedveil.privacy.dp.participation import ParticipationCap, participation_bound
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.protocol import fields as F
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.dp_from_config import async_dp_config, cohorts_are_secret, dp_config
from fedveil.server.engine.ledger_opening import open_ledger, request_head
from fedveil.server.engine.release_mechanism import Release
from fedveil.server.engine.requests import ClientPrivacy
from fedveil.server.engine.sampling import CohortDraws, cohort_commitment

log = logging.getLogger("fedveil.privacy")

# A private record sink: the run's operator-only annex (RunStore.append_private).
PrivateSink = Callable[[dict[str, Any]], None]
DISPATCH = "dispatch"  # private-annex record kind: one dispatch of one client


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

    def cohort_sampler(self) -> CohortDraws | None:
        """None: the engine's sampler (secret cohorts, amplification by sampling)."""
        return None

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


class AsyncCentralDP:
    """Dispatch gate + release step of central DP under asynchronous participation."""

    adversary_note = (
        "central DP, asynchronous: the coordinator sees the un-noised sums (a trusted "
        "curator); no epsilon holds against it"
    )
    budget_against = "observers"
    # Central DP charges at the apply (`release`); distributed DP when a group's sum is
    # unmasked (distributed_release.py), which changes what the engine does on resume.
    charges_at_unmask = False

    def __init__(
        self,
        cfg: RunConfig,
        num_clients: int,
        ledger_path: Path,
        *,
        run_id: str | None = None,
        signer: LedgerSigner | None = None,
        private: PrivateSink | None = None,
        dispatches: Mapping[int, int] | None = None,
        cohort_key: bytes | None = None,
    ) -> None:
        self.config = async_dp_config(cfg, num_clients)  # ConfigError when not accountable
        # Nothing is sampled (no amplification to protect), but which clients form each
        # group is still kept from observers: groups and their secure-aggregation graph
        # seeds follow this secret key (buffered_scheduler.py), whose SHA-256 commitment opens
        # the ledger, unless dp.seeded_cohorts asks for the public seed.
        self.cohorts_secret = cohorts_are_secret(cfg)
        self.cohort_key = cohort_key if cohort_key is not None else secrets.token_bytes(32)
        self.cohort_commitment = cohort_commitment(self.cohort_key) if self.cohorts_secret else None
        assert self.config.max_participations is not None
        self.clip = self.config.clip_norm
        self.bound = stated_bound(self.config)
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(ledger_path, run_id=run_id, signer=signer)
        # Signed before the first dispatch: devices pin its key (ledger_opening.py).
        open_ledger(self.ledger, cfg, self.cohort_commitment)
        self.budget = PrivacyBudget.from_ledger(self.config, self.ledger.releases)
        self.private = private
        self.cap = ParticipationCap(self.config.max_participations, dispatches)
        # A release divides by the buffer K (public), never by how many arrived.
        self.divisor = float(cfg.server.buffer)

    # -------------------------------------------------------------- dispatch gate
    def eligible(self, clients: Iterable[int]) -> list[int]:
        """The clients that may still be dispatched (fewer than P dispatches so far)."""
        return self.cap.eligible(clients)

    def dispatch(self, client: int, version: int) -> None:
        """Count one dispatch of `client` durably; call BEFORE sending it the model.
        Raises ParticipationCapError past server.max_participations (nothing counted)."""
        if not self.cap.admits(client):
            self.cap.dispatch(client)  # raises, naming the client and the cap
        if self.private is not None:
            # No "round" field: RunStore.truncate_private keeps it on resume.
            self.private({"kind": DISPATCH, "client": int(client), "version": int(version)})
        self.cap.dispatch(client)

    def admits(self, client: int) -> bool:
        """Whether `client` may be dispatched once more."""
        return self.cap.admits(client)

    def exhausted(self, population: Iterable[int]) -> bool:
        """No client may be dispatched again: the run must end."""
        return self.cap.exhausted(population)

    # --------------------------------------------------------------- the release
    @property
    def last_round(self) -> int:
        """The model version of the last release (ledger rounds count releases)."""
        releases = self.ledger.releases
        return int(releases[-1].get("training_round", releases[-1]["round"])) if releases else 0

    def client_fields(self) -> ClientPrivacy:
        return ClientPrivacy(
            clip_norm=self.clip,
            weighting=F.WEIGHT_UNIFORM,
            clip_indicator=False,
            ledger_head=request_head(self.ledger),
        )

    def cohort_sampler(self) -> CohortDraws | None:
        """None: nothing is sampled; the cap bounds participation (`dispatch`)."""
        return None

    def release(self, round_num: int, agg: Aggregate | None, model_size: int) -> Release:
        """Noise the buffer's sum (`agg`: the staleness-weighted sum of its re-clipped
        updates, each weight <= 1; None: noise only), write the ledger entry durably, and
        return (noised total) / server.buffer (public) to apply as version `round_num`."""
        total = torch.zeros(model_size) if agg is None else agg.total
        flat = total.detach().cpu().reshape(-1).to(torch.float64)
        noised = add_gaussian_noise(flat.numpy(), self.config.noise_multiplier, self.clip)
        extra: dict[str, Any] = {
            "training_round": int(round_num),
            "budget_against": self.budget_against,
        }
        if not len(self.ledger) and self.cohort_commitment is not None:
            extra["cohort_commitment"] = self.cohort_commitment
        entry = self.budget.record_release(
            self.ledger,
            round_number=self.ledger.last_round + 1,
            event=self.config.round_event(),
            clip_norm=self.clip,
            extra=extra,
        )
        metrics = {
            "epsilon": entry["epsilon"],
            "epsilon_cap_bound": self.bound,
            "clip_norm": self.clip,
            "noise_multiplier": self.config.noise_multiplier,
        }
        update = (torch.from_numpy(noised) / self.divisor).reshape(total.shape).to(total.dtype)
        return Release(update, metrics)

    # ---------------------------------------------------------------- the figures
    def epsilon(self) -> float:
        """The public figure: the bound for a client in min(releases, P) releases."""
        return self.budget.spent()

    def coordinator_epsilon(self) -> float | None:
        return None  # central DP: the coordinator is a trusted curator

    def coordinator_bound(self) -> float | None:
        return None

    def realised_epsilon(self) -> float:
        """The busiest client's epsilon (its dispatches, capped by the releases so far):
        counts participation, so the operator's private annex only."""
        busiest = self.cap.busiest()
        if not busiest:
            return 0.0
        return participation_bound(
            self.budget.history, busiest, self.config.delta, self.config.accountant_name
        )

    def admits_next_round(self) -> tuple[bool, float]:
        """(allowed, epsilon after one more release): always within the budget, since the
        cap-based bound was checked before the run."""
        eps = self.budget.epsilon_after(self.config.round_event())
        return eps <= self.config.budget_epsilon, eps

    def close(self, kind: str, training_round: int, reason: str | None = None) -> None:
        """The ledger's signed closing record ('final' or 'interrupted'), and the realised
        figure to the private annex."""
        if self.ledger.closed:
            return
        fields: dict[str, Any] = {"training_round": training_round, "epsilon": self.epsilon()}
        bound = self.coordinator_bound()
        if bound is not None:  # distributed DP: public, the ledger's parameters alone give it
            fields["epsilon_coordinator_bound"] = bound
        if reason:
            fields["reason"] = reason
        entry = self.ledger.close(kind, fields)
        if self.private is not None:
            self.private(
                {
                    "kind": "close",
                    "ledger_kind": kind,
                    "ledger_seq": entry.get("seq"),
                    "training_round": training_round,
                    "epsilon_client_max_realised": self.realised_epsilon(),
                    "dispatches_max": self.cap.busiest(),
                }
            )


def dispatch_counts(private_records: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Per-client dispatch counts from the private annex (a resume's starting point)."""
    counts: dict[int, int] = {}
    for record in private_records:
        if record.get("kind") == DISPATCH:
            client = int(record["client"])
            counts[client] = counts.get(client, 0) + 1
    return counts
