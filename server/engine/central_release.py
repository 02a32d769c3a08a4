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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Unpack

import torch

from fedveil.config import RunConfig
from fedveil.privacy.dp import add_gaussian_noise, next_clip_norm, noised_count
from fedveil.privacy.dp.async_plan import stated_bound
from fedveil.privacy.dp.participation import ParticipationCap, participation_bound
from fedveil.protocol import fields as F
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.dp_from_config import async_dp_config, dp_config
from fedveil.server.engine.ledger_opening import request_head
from fedveil.server.engine.ledgered_release import LedgerArgs, LedgeredRelease
from fedveil.server.engine.release_mechanism import Release
from fedveil.server.engine.requests import ClientPrivacy
from fedveil.server.engine.sampling import CohortDraws

log = logging.getLogger("fedveil.privacy")

DISPATCH = "dispatch"  # private-annex record kind: one dispatch of one client


class CentralDP(LedgeredRelease):
    """Central DP of sync rounds: noise on the sum of a sampled cohort, amplified."""

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
        participations: Mapping[int, int] | None = None,
        **ledger: Unpack[LedgerArgs],
    ) -> None:
        self.config = dp_config(cfg, num_clients)
        s = cfg.server
        # Divide by the expected cohort, never by the number that arrived (not private).
        self.expected_cohort = (
            s.per_round if s.sampling == "fixed" else cfg.poisson_rate * num_clients
        )
        self.budget_against = cfg.dp.budget_against
        # Secret cohorts (and secure-aggregation graphs) follow its cohort key; its
        # ledger is signed before round 1: devices pin the key and check every head.
        self._open(cfg, ledger_path, ledger)
        self.participations: dict[int, int] = dict(participations or {})
        releases = self.ledger.releases
        self.clip = (
            float(releases[-1].get("next_clip_norm", self.config.clip_norm))
            if releases
            else self.config.clip_norm
        )

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
        entry = self._charge(self._event(), self.clip, {"training_round": round_num, **extra})
        metrics = {
            "epsilon": entry["epsilon"],
            "clip_norm": self.clip,
            "noise_multiplier": self.config.noise_multiplier,
        }
        self.clip = next_clip
        return Release(torch.from_numpy(noised) / self.expected_cohort, metrics)

    def _closing_annex(self) -> dict[str, Any] | None:
        """The busiest client's figure counts participations: the operator's only."""
        realised = self.coordinator_epsilon()
        return None if realised is None else {"epsilon_coordinator_max": realised}


class AsyncCentralDP(LedgeredRelease):
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
        dispatches: Mapping[int, int] | None = None,
        **ledger: Unpack[LedgerArgs],
    ) -> None:
        self.config = async_dp_config(cfg, num_clients)  # ConfigError when not accountable
        assert self.config.max_participations is not None
        self.clip = self.config.clip_norm
        self.bound = stated_bound(self.config)
        # Nothing is sampled (no amplification to protect), but which clients form each
        # group is still kept from observers: groups and their secure-aggregation graph
        # seeds follow the secret cohort key (buffered_scheduler.py), unless
        # dp.seeded_cohorts asks for the public seed. The ledger is signed before the
        # first dispatch: devices pin its key (ledger_opening.py).
        self._open(cfg, ledger_path, ledger)
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
        entry = self._charge(self._event(), self.clip, {"training_round": int(round_num)})
        metrics = {
            "epsilon": entry["epsilon"],
            "epsilon_cap_bound": self.bound,
            "clip_norm": self.clip,
            "noise_multiplier": self.config.noise_multiplier,
        }
        update = (torch.from_numpy(noised) / self.divisor).reshape(total.shape).to(total.dtype)
        return Release(update, metrics)

    # ---------------------------------------------------------------- the figures
    # epsilon() (LedgeredRelease): the public figure, the bound for a client in
    # min(releases, P) releases; the coordinator's figures are None (a trusted curator).
    def realised_epsilon(self) -> float:
        """The busiest client's epsilon (its dispatches, capped by the releases so far):
        counts participation, so the operator's private annex only."""
        busiest = self.cap.busiest()
        if not busiest:
            return 0.0
        return participation_bound(
            self.budget.history, busiest, self.config.delta, self.config.accountant_name
        )

    def _closing_annex(self) -> dict[str, Any] | None:
        """The realised figures: the busiest client's epsilon and dispatches."""
        return {
            "epsilon_client_max_realised": self.realised_epsilon(),
            "dispatches_max": self.cap.busiest(),
        }


def dispatch_counts(private_records: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Per-client dispatch counts from the private annex (a resume's starting point)."""
    counts: dict[int, int] = {}
    for record in private_records:
        if record.get("kind") == DISPATCH:
            client = int(record["client"])
            counts[client] = counts.get(client, 0) + 1
    return counts
