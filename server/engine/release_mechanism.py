"""The release-mechanism interface: what the engine may publish of a server update.

Every scheduler (barrier, buffer of K, staleness bound) hands the engine one sum per
server update; the release mechanism turns it into the update the server optimizer
applies, and accounts for it:

    none          no mechanism (`privacy` None): the contributors' mean, when at least
                  the scheduler's `min_contributors` contributed (round_steps.plain_release)
    central       central_release.CentralDP (sync: sampled rounds, amplified) and
                  central_release.AsyncCentralDP (async buffers: no sampling, every client
                  capped at server.max_participations): Gaussian noise on the sum, the
                  signed ledger entry, then the update
    distributed   distributed_release.DistributedDP / AsyncDistributedDP: the clients' Skellam
                  shares noise the sum under secure aggregation; charged at the channel's
                  UnmaskGate before unmasking, released here without more noise

The mechanisms of asynchronous training also gate dispatches (`ParticipationCapped`):
each client is counted durably before it is sent the model, and never past its cap.

    ftrl          ftrl_stage.FtrlDP: correlated noise on the sum; its cohorts are drawn
                  within its participation schema (`cohort_sampler`)

How a mechanism constrains the cohorts is one of its members too: `cohort_sampler`
returns the sampler the sync rounds must draw from (DP-FTRL's schema), or None for the
engine's own (secret, from `cohort_key`, when `cohorts_secret`; else the public seed).

A new mechanism is one more class with these members, built by
pipeline.make_privacy_pipeline; the engine and every scheduler call it the same way,
never by its class.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from fedveil.privacy.dp.config import DpConfig
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.requests import ClientPrivacy
from fedveil.server.engine.sampling import CohortDraws


@dataclass
class Release:
    """An update the engine may apply, with the figures the round's record shows."""

    update: torch.Tensor
    metrics: dict[str, Any]


@runtime_checkable
class ReleaseMechanism(Protocol):
    """A DP release of one server update's sum, with its accounting and ledger."""

    config: DpConfig
    adversary_note: str
    budget_against: str
    cohorts_secret: bool  # whether cohorts (groups) are drawn from `cohort_key`
    cohort_key: bytes

    @property
    def last_round(self) -> int:
        """The training round (model version) of the last release on the ledger."""
        ...

    def client_fields(self) -> ClientPrivacy:
        """The mechanism's part of every training request (clip, weighting, ledger head)."""
        ...

    def cohort_sampler(self) -> CohortDraws | None:
        """The sampler sync rounds must draw their cohorts from, when the guarantee
        constrains who may take part (DP-FTRL: its participation schema); None: the
        engine's own (secret from `cohort_key` when `cohorts_secret`, else seeded)."""
        ...

    def admits_next_round(self) -> tuple[bool, float]:
        """(allowed, epsilon after one more release): checked before a sampled round."""
        ...

    def release(self, round_num: int, agg: Aggregate | None, model_size: int) -> Release | None:
        """The update to apply as version `round_num`, charged and on the ledger before
        it is returned; `agg` None: nothing arrived. None: nothing may be published."""
        ...

    def epsilon(self) -> float:
        """The observers' epsilon so far (what the public files state)."""
        ...

    def coordinator_bound(self) -> float | None:
        """The public bound against the coordinator; None: none holds (central DP)."""
        ...

    def close(
        self,
        kind: str,
        training_round: int,
        reason: str | None = None,
        *,
        model_sha256: str | None = None,
    ) -> None:
        """The ledger's signed closing record: 'final' or 'interrupted'; `model_sha256`:
        the hash of the model file the run publishes as of it (None: no model bound)."""
        ...


@runtime_checkable
class ParticipationCapped(Protocol):
    """A mechanism that bounds each client's releases by counting its dispatches
    (asynchronous training: nothing is sampled, so nothing is amplified)."""

    charges_at_unmask: bool  # distributed: each group is charged when it is unmasked
    bound: float  # the cap-based epsilon bound stated before the run

    def eligible(self, clients: Iterable[int]) -> list[int]:
        """The clients that may still be dispatched."""
        ...

    def admits(self, client: int) -> bool:
        """Whether `client` may be dispatched once more."""
        ...

    def dispatch(self, client: int, version: int) -> None:
        """Count one dispatch of `client` durably, BEFORE it is sent the model."""
        ...
