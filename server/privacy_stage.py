"""Central DP on the server: budget check before a round, noise and ledger entry after it.

DP-FedAvg (McMahan et al. 2018): clients clip their update to L2 norm C and
send it with weight 1; the server adds N(0, (zC)^2) to the sum, writes the
release to the ledger (durably) and only then publishes sum / expected cohort.
With adaptive clipping the count of unclipped clients is noised too and moves
C toward the target quantile (Andrew et al. 2021).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig
from fedveil.privacy.dp import (
    DpConfig,
    Ledger,
    PrivacyBudget,
    SkellamParams,
    add_gaussian_noise,
    calibrate_noise_multiplier,
    next_clip_norm,
    noised_count,
)

from .aggregation import Aggregate

log = logging.getLogger("fedveil.privacy")

MECHANISM_NAMES = {"central": "central_gaussian", "distributed": "distributed_skellam"}


def resolve_neighbouring(cfg: RunConfig) -> str:
    if cfg.dp.neighbouring != "auto":
        return cfg.dp.neighbouring
    return "replace_one" if cfg.server.sampling == "fixed" else "add_remove"


def dp_config(cfg: RunConfig, num_clients: int) -> DpConfig:
    """The DP layer's config for this run; z is calibrated from the budget when not given."""
    dp, s = cfg.dp, cfg.server
    poisson = s.sampling == "poisson"
    q = cfg.poisson_rate if poisson else s.per_round / num_clients
    expected = q * num_clients if poisson else s.per_round
    neighbouring = resolve_neighbouring(cfg)
    mechanism = MECHANISM_NAMES[dp.mechanism]
    z = dp.noise_multiplier
    if z == 0:
        z = calibrate_noise_multiplier(
            dp.epsilon,
            dp.delta,
            s.rounds,
            q,
            sampling=s.sampling,
            neighbouring=neighbouring,
            population_size=num_clients,
            accountant=dp.accountant,
            mechanism=mechanism,
        )
        log.info(
            "calibrated noise multiplier z=%.4f for epsilon=%g over %d rounds",
            z,
            dp.epsilon,
            s.rounds,
        )
    return DpConfig(
        mechanism=mechanism,
        noise_multiplier=z,
        clip_norm=dp.clip,
        sampling_rate=q,
        rounds=s.rounds,
        delta=dp.delta,
        budget_epsilon=dp.epsilon,
        sampling=s.sampling,
        neighbouring=neighbouring,
        population_size=num_clients,
        cohort_size=max(1, round(expected)),
        accountant=dp.accountant,
        adaptive_clipping=dp.adaptive_clip,
        target_quantile=dp.target_quantile,
        clip_learning_rate=dp.clip_lr,
        modulus_bits=dp.modulus_bits,
    )


class CentralDP:
    def __init__(self, cfg: RunConfig, num_clients: int, ledger_path: Path) -> None:
        self.config = dp_config(cfg, num_clients)
        self.expected_cohort = self.config.sampling_rate * num_clients
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(ledger_path)
        self.budget = PrivacyBudget.from_ledger(self.config, self.ledger.entries)
        entries = self.ledger.entries
        self.clip = (
            float(entries[-1].get("next_clip_norm", self.config.clip_norm))
            if entries
            else self.config.clip_norm
        )

    @property
    def last_round(self) -> int:
        """The training round of the last release (ledger rounds count releases)."""
        entries = self.ledger.entries
        return int(entries[-1].get("training_round", entries[-1]["round"])) if entries else 0

    def epsilon(self) -> float:
        return self.budget.spent()

    def admits_next_round(self) -> tuple[bool, float]:
        """(allowed, epsilon after the round) — checked BEFORE a round runs."""
        eps = self.budget.epsilon_after(self.config.round_event())
        return eps <= self.config.budget_epsilon, eps

    def client_config(self) -> dict[str, Any]:
        return {
            "clip_norm": self.clip,
            "weighting": "uniform",
            "clip_indicator": self.config.adaptive_clipping,
        }

    def release(
        self, round_num: int, agg: Aggregate | None, model_size: int, planned: int
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Noise the sum, write the ledger entry, return the update to publish."""
        total = torch.zeros(model_size) if agg is None else agg.total.detach().cpu()
        noised = add_gaussian_noise(total.numpy(), self.config.update_noise_multiplier, self.clip)
        extra: dict[str, Any] = {}
        next_clip = self.clip
        if self.config.adaptive_clipping:
            unclipped = 0.0 if agg is None else agg.extras.get("unclipped", 0.0)
            count = noised_count(unclipped, self.config.count_stddev)
            next_clip = next_clip_norm(
                self.clip,
                count,
                self.expected_cohort,
                self.config.target_quantile,
                self.config.clip_learning_rate,
            )
            extra["next_clip_norm"] = next_clip
        extra["training_round"] = round_num
        entry = self.budget.record_release(
            self.ledger,
            round_number=self.ledger.last_round + 1,
            event=self.config.round_event(),
            clip_norm=self.clip,
            cohort_planned=planned,
            cohort_aggregated=0 if agg is None else len(agg.contributors),
            extra=extra,
        )
        metrics = {
            "epsilon": entry["epsilon"],
            "clip_norm": self.clip,
            "noise_multiplier": self.config.noise_multiplier,
        }
        self.clip = next_clip
        # Divide by the expected cohort, never by the number that arrived (not private).
        return torch.from_numpy(noised) / self.expected_cohort, metrics


class DistributedDP(CentralDP):
    """Clients add the noise (Skellam shares under secure aggregation); the server only
    accounts: the event of a round uses the noise of the clients that actually survived."""

    params: SkellamParams | None = None

    def bind(self, params: SkellamParams) -> None:
        self.params = params

    def _event_for(self, survivors: int) -> Any:
        assert self.params is not None
        z = self.params.noise_multiplier_for(
            max(survivors, self.params.min_clients), self.config.neighbouring
        )
        return self.config.round_event(z)

    def admits_next_round(self) -> tuple[bool, float]:
        # Worst case before the round: only the fewest decodable survivors' noise.
        assert self.params is not None
        eps = self.budget.epsilon_after(self._event_for(self.params.min_clients))
        return eps <= self.config.budget_epsilon, eps

    def client_config(self) -> dict[str, Any]:
        return {"clip_norm": self.config.clip_norm, "weighting": "uniform"}

    def release(
        self, round_num: int, agg: Aggregate | None, model_size: int, planned: int
    ) -> tuple[torch.Tensor, dict[str, Any]] | None:
        if agg is None:
            return None  # aborted: the server holds nothing, so nothing is released
        survivors = len(agg.contributors)
        event = self._event_for(survivors)
        entry = self.budget.record_release(
            self.ledger,
            round_number=self.ledger.last_round + 1,
            event=event,
            clip_norm=self.config.clip_norm,
            cohort_planned=planned,
            cohort_aggregated=survivors,
            extra={"training_round": round_num},
        )
        metrics = {
            "epsilon": entry["epsilon"],
            "clip_norm": self.config.clip_norm,
            "noise_multiplier": event.noise_multiplier,
        }
        return agg.total.detach().cpu() / self.expected_cohort, metrics
