"""A run config's silo plan: the encoding every silo uses, how many silos a sum needs, and
how many colluding silos the distributed-DP noise tolerates.

* `min_silos` = N - floor(secagg.dropout_rate x N), at least 2: a round whose attempt has
  fewer members is not released (a silo dying takes the round to a rerun among survivors).
* Distributed DP: `corrupt` = ceil(secagg.adversarial_rate x N) silos may collude (they
  know and subtract their own noise shares), so the noise is calibrated to the
  `min_silos - corrupt` honest shares (at least 1, else refused); z comes from the budget
  as in the centralised round (privacy/dp/plan.dp_config: fixed cohort of N, rate 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedveil.config import RunConfig
from fedveil.privacy.dp.plan import dp_config
from fedveil.privacy.dp.skellam import SkellamParams
from fedveil.privacy.secagg import Quantizer

from .round import SiloDp


@dataclass(frozen=True)
class SiloPlan:
    world: int
    min_silos: int
    quantizer: Quantizer | None
    dp: SiloDp | None
    tolerated_colluders: int  # under DP: silos whose shares the noise does not count on

    def describe(self) -> str:
        if self.dp is None:
            return (
                f"{self.world} silos, sums of at least {self.min_silos}; no DP: each silo "
                "learns the sum, and N - 1 colluding silos learn the remaining one's update"
            )
        return (
            f"{self.world} silos, sums of at least {self.min_silos}; distributed DP "
            f"(Skellam), noise calibrated to {self.dp.params.min_clients} honest shares: "
            f"holds against up to {self.tolerated_colluders} colluding silos"
        )


def plan_silos(cfg: RunConfig, model_size: int, max_weight: int) -> SiloPlan:
    """ValueError naming the setting when no round could be released."""
    n = cfg.data.num_clients
    min_silos = max(2, n - math.floor(cfg.secagg.dropout_rate * n))
    if cfg.dp.mechanism == "none":
        weight = cfg.secagg.max_weight or max_weight
        quantizer = Quantizer(cfg.secagg.clip_range, cfg.secagg.levels, n, max(1, weight))
        return SiloPlan(n, min_silos, quantizer, None, 0)
    corrupt = math.ceil(cfg.secagg.adversarial_rate * n)
    honest = min_silos - corrupt
    if honest < 1:
        raise ValueError(
            f"secagg.adversarial_rate = {cfg.secagg.adversarial_rate}: {corrupt} colluding "
            f"silos of the {min_silos} a sum needs leave no honest noise share"
        )
    privacy = dp_config(cfg.dp_parameters(), n)
    params = SkellamParams.calibrate(
        dim=model_size,
        clip_norm=cfg.dp.clip_norm,
        noise_multiplier=privacy.noise_multiplier,
        num_clients=n,
        min_clients=honest,
        bits=cfg.dp.modulus_bits,
    )
    return SiloPlan(n, min_silos, None, SiloDp(params, cfg.dp.epsilon, cfg.dp.delta), corrupt)
