"""DP-FTRL on the server: correlated noise on each round's sum, the schema's cohorts.

The round's sum of clipped updates (seen in the clear or only as a secure-aggregation
sum) gets sigma x w_t, release t of the factorisation's correlated noise
(privacy/dp/ftrl/noise.py), with sigma = z x clip x sensitivity(C, schema). Applying
the noised sums with the server optimizer is the FTRL update: with plain SGD the model
after t rounds is the initial one minus the step times the NOISY PREFIX SUM (B xi on
it); momentum applies to the noised sums, as in Kairouz et al. 2021.

Order per release (the resume rule): budget check at the release index, the noise
state persisted (private/, mode 600), the signed ledger entry, then the update is
published. The release index is the ledger's: a resumed run continues from the
ledger's count and discards a drawn but uncharged noise (noise.FtrlNoise.restore).

Against the coordinator this is central DP: it sees the un-noised sum (a trusted
curator) and no epsilon holds against it. Against observers the epsilon holds only if
the participation schema held: the cohort sampler here enforces it, and devices
refuse participations beyond their own count (client/edge).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from fedveil.config import RunConfig
from fedveil.privacy.dp import BudgetExceededError, DpConfig
from fedveil.privacy.dp.ftrl import FtrlNoise
from fedveil.privacy.dp.ftrl.ftrl_accounting import epsilon_after
from fedveil.privacy.dp.ftrl.ftrl_plan import (
    ftrl_factorization,
    ftrl_neighbouring,
    ftrl_noise_multiplier,
    ftrl_schema,
)
from fedveil.privacy.dp.ftrl.ledger_fields import ftrl_entry_fields
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.protocol import fields as F
from fedveil.protocol.dp_rules import DP_FTRL, FIXED, PLD
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.central_release import CentralDP
from fedveil.server.engine.ftrl_sampling import SchemaCohortSampler
from fedveil.server.engine.ledger_opening import open_run_ledger, request_head
from fedveil.server.engine.ledgered_release import PrivateSink
from fedveil.server.engine.release_mechanism import Release
from fedveil.server.engine.requests import ClientPrivacy

log = logging.getLogger("fedveil.privacy")

NOISE_STATE_FILE = "ftrl_noise.npz"

GUARANTEE_NEEDS = (
    "DP-FTRL: the epsilon against observers of the published models holds if no client "
    "took part more often, or closer together, than the participation schema allows "
    "({schema}) over the planned {rounds} rounds, and if the noise state stayed secret. "
    "It does not need secret or uniform cohorts. The coordinator sees each round's "
    "un-noised sum: it is a trusted curator, and no epsilon holds against it."
)


class FtrlDP(CentralDP):
    """The DP-FTRL release stage (the CentralDP interface the round engine calls)."""

    adversary_note = (
        "DP-FTRL: the coordinator sees the un-noised sum before adding the correlated noise "
        "(a trusted curator); no epsilon holds against it"
    )

    def __init__(
        self,
        cfg: RunConfig,
        num_clients: int,
        ledger_path: Path,
        *,
        model_size: int,
        noise_state: Path | None = None,
        run_id: str | None = None,
        signer: LedgerSigner | None = None,
        private: PrivateSink | None = None,
        participations: Mapping[int, int] | None = None,
        cohort_key: bytes | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        d = cfg.dp
        params = cfg.dp_parameters()
        self.schema = ftrl_schema(params)
        self.factorization = ftrl_factorization(params)
        self.neighbouring = ftrl_neighbouring(params)
        z = ftrl_noise_multiplier(params)
        self.sensitivity = self.factorization.sensitivity(self.schema)
        # What the report, summary and metrics read (q = 1: no amplification).
        self.config = DpConfig(
            mechanism=DP_FTRL,
            noise_multiplier=z,
            clip_norm=d.clip_norm,
            sampling_rate=1.0,
            sampling=FIXED,
            rounds=cfg.server.rounds,
            delta=d.delta,
            budget_epsilon=d.epsilon,
            neighbouring=self.neighbouring,
            population_size=num_clients,
            cohort_size=cfg.server.per_round,
            accountant=PLD,
        )
        self.expected_cohort = cfg.server.per_round
        self.cohorts_secret = False  # the guarantee does not rest on secret cohorts
        self.cohort_key = cohort_key if cohort_key is not None else secrets.token_bytes(32)
        self.cohort_commitment = None
        self.budget_against = d.budget_against
        self.ledger = open_run_ledger(ledger_path, cfg, None, run_id=run_id, signer=signer)
        self.private = private
        self.participations = dict(participations or {})
        self.clip = d.clip
        sigma = z * d.clip * self.sensitivity
        self.noise = FtrlNoise(self.factorization, sigma, model_size, noise_state, rng=rng)
        self.noise.restore(len(self.ledger.releases))
        self._num_clients = num_clients
        self._per_round = cfg.server.per_round

    def epsilon(self) -> float:
        return self._epsilon_at(len(self.ledger.releases))

    def _epsilon_at(self, releases: int) -> float:
        return epsilon_after(
            self.factorization,
            self.schema,
            self.config.noise_multiplier,
            releases,
            self.config.delta,
            self.neighbouring,
        )

    def admits_next_round(self) -> tuple[bool, float]:
        index = len(self.ledger.releases) + 1
        if not (index <= self.factorization.rounds):
            # The factorisation covers T releases: a round past them is refused, not noised.
            return False, float("inf")
        eps = self._epsilon_at(index)
        return eps <= self.config.budget_epsilon, eps

    def client_fields(self) -> ClientPrivacy:
        return ClientPrivacy(
            clip_norm=self.clip,
            weighting=F.WEIGHT_UNIFORM,
            ledger_head=request_head(self.ledger),
        )

    def cohort_sampler(self) -> SchemaCohortSampler:
        """Fixed-size cohorts among the clients the schema still allows, drawn from the
        run's CSPRNG cohort key (a resume draws the same ones)."""
        return SchemaCohortSampler(
            self._num_clients,
            self._per_round,
            self.schema,
            self.factorization.rounds,
            self.cohort_key,
        )

    def guarantee_statement(self) -> str:
        return GUARANTEE_NEEDS.format(
            schema=self.schema.describe(), rounds=self.factorization.rounds
        )

    def release(self, round_num: int, agg: Aggregate | None, model_size: int) -> Release | None:
        """Noise the sum with release t's correlated noise, record it, then publish."""
        index = len(self.ledger.releases) + 1
        allowed, eps = self.admits_next_round()
        if not allowed:
            raise BudgetExceededError(
                f"DP-FTRL release {index}: epsilon would reach {eps:.6g} > budget "
                f"{self.config.budget_epsilon:.6g} (or past the planned T = "
                f"{self.factorization.rounds}); do not release"
            )
        total = torch.zeros(model_size) if agg is None else agg.total.detach().cpu()
        noise = self.noise.next_noise(index)  # persisted before the ledger entry
        noised = (total.double().numpy() + noise).astype(np.float32)
        fields = ftrl_entry_fields(
            round_number=index,
            factorization=self.factorization,
            schema=self.schema,
            noise_multiplier=self.config.noise_multiplier,
            clip_norm=self.clip,
            neighbouring=self.neighbouring,
            delta=self.config.delta,
            budget_epsilon=self.config.budget_epsilon,
            population_size=self._num_clients,
            epsilon=eps,
        )
        fields.update({"training_round": round_num, "budget_against": self.budget_against})
        entry = self.ledger.record(fields)
        metrics = {
            "epsilon": entry["epsilon"],
            "clip_norm": self.clip,
            "noise_multiplier": self.config.noise_multiplier,
        }
        return Release(torch.from_numpy(noised) / self.expected_cohort, metrics)


def noise_state_path(ledger_path: Path) -> Path:
    """run/private/ftrl_noise.npz for the ledger run/privacy/ledger.jsonl."""
    return ledger_path.parent.parent / "private" / NOISE_STATE_FILE
