"""The DP plan of an asynchronous (server.mode = 'async' or 'ssp') run, or its refusal.

Asynchronous participation is not sampled, so nothing is amplified (q = 1), and a
client's releases compose without bound unless capped: DP requires
server.max_participations P. Every client is in at most P releases (the engine never
dispatches it a (P+1)-th time, and one dispatch puts its update in at most one
release), so its epsilon is at most the P-fold composition of one release
(participation.py). The bound is stated before the run, and a config whose bound
exceeds dp.epsilon is refused here, before any data is loaded (z = 0 calibrates z to
it).

- Central DP: the server adds N(0, (zC)^2) to each released sum, accounted with
  Opacus' RDP by default.
- Distributed DP: each secure-aggregation group of G is one release, its noise the
  Skellam shares its members add. One plan serves every group (plan.py with G as the
  cohort): the group's threshold t from the threat model for G, the fewest survivors
  it may unmask (t, or G less its expected dropouts), and of those at most
  ceil(adversarial_rate x G) corrupt, so every unmasked group sum carries at least
  `min_honest` honest shares, sized to reach z. A group that reaches its deadline
  with fewer survivors is not unmasked (the unmask gate and every member refuse), so
  the floor holds whenever and however the sum is recovered. Accounted only with
  skellam_rdp, the Skellam curve at q = 1 (its Gaussian-equivalent z at `min_honest`
  shares); the bound is stated at the plan's z (`check_group_bound`). Nothing is
  amplified, so the coordinator's unamplified figure is the same bound.

Adjacency: zero-out (the target's updates replaced by zeros). Which clients fill a
buffer depends on availability, not data; under add/remove, removing a client would
put another client's update in its slot (a replacement, sensitivity 2C), which the
add/remove shift does not cover, so add/remove is refused. replace_one is accepted
(sensitivity 2C, accounted with PLD).

Refused, because no accounting for them is stated here (each refusal names the field):
adaptive clipping (its count release is calibrated to a sampled cohort), a missing cap,
add/remove adjacency, and distributed DP on devices (fedveil.config.async_dp
check_wall_clock_dp says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.config import ConfigError, RunConfig
from fedveil.config.async_dp import (
    async_neighbouring,
    check_async_dp,
    participation_cap,
    server_mode,
)
from fedveil.protocol.dp_rules import PLD, POISSON, RDP, REPLACE_ONE, SKELLAM_RDP_INTEGER

from .calibration import calibrate_noise_multiplier
from .config import DpConfig
from .participation import cap_bound
from .plan import MECHANISM_NAMES

if TYPE_CHECKING:
    from .plan import DistributedDpPlan


def async_accountant(cfg: RunConfig, neighbouring: str) -> str:
    """dp.accountant, 'auto' resolved: distributed DP's only sound one (skellam_rdp_integer);
    for central DP Opacus' RDP under zero-out, PLD under replace-one (Opacus does not
    model replace-one's 2C distance)."""
    if cfg.dp.accountant != "auto":
        return cfg.dp.accountant
    if cfg.dp.mechanism == "distributed":
        return SKELLAM_RDP_INTEGER
    return PLD if neighbouring == REPLACE_ONE else RDP


def async_dp_config(cfg: RunConfig, num_clients: int) -> DpConfig:
    """The DP layer's config of an asynchronous run: unsampled releases (q = 1), capped at
    server.max_participations; z calibrated so that the cap meets dp.epsilon when
    dp.noise_multiplier = 0. Raises ConfigError when the cap-based bound exceeds dp.epsilon
    or the accounting cannot be stated (check_async_dp)."""
    check_async_dp(cfg)
    dp = cfg.dp
    cap = participation_cap(cfg)
    neighbouring = async_neighbouring(cfg)
    accountant = async_accountant(cfg, neighbouring)
    mechanism = MECHANISM_NAMES[dp.mechanism]
    z = float(dp.noise_multiplier)
    try:
        if z == 0:
            z = calibrate_noise_multiplier(
                dp.epsilon,
                dp.delta,
                cap,
                1.0,
                sampling=POISSON,
                neighbouring=neighbouring,
                accountant=accountant,
                mechanism=mechanism,
            )
        config = DpConfig(
            mechanism=mechanism,
            noise_multiplier=z,
            clip_norm=dp.clip,
            sampling_rate=1.0,
            rounds=cap,
            delta=dp.delta,
            budget_epsilon=dp.epsilon,
            sampling=POISSON,
            neighbouring=neighbouring,
            population_size=num_clients,
            accountant=accountant,
            modulus_bits=dp.modulus_bits,
            max_participations=cap,
        )
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(
            f"dp.accountant = {dp.accountant!r} with server.mode = {server_mode(cfg)!r}: {error}"
        ) from None
    bound = stated_bound(config)
    if bound > dp.epsilon:
        raise ConfigError(
            f"dp.noise_multiplier = {z:g} with server.max_participations = {cap}: a client "
            f"in {cap} unsampled releases has epsilon {bound:.4g} > dp.epsilon = "
            f"{dp.epsilon:g} (delta {dp.delta:g}, {config.accountant_name}); raise "
            "dp.noise_multiplier (0 calibrates it), lower server.max_participations, or "
            "raise dp.epsilon"
        )
    return config


def stated_bound(config: DpConfig, noise_multiplier: float | None = None) -> float:
    """The bound stated before the run: a client in `max_participations` releases (of z
    `noise_multiplier`; None: the config's)."""
    assert config.max_participations is not None
    return cap_bound(
        config.round_event(noise_multiplier),
        config.max_participations,
        config.delta,
        config.accountant_name,
    )


def check_group_bound(config: DpConfig, plan: DistributedDpPlan) -> float:
    """Distributed DP: the bound stated before the run, at the z every unmasked group sum
    reaches (the plan's fewest honest shares); ConfigError when it exceeds dp.epsilon."""
    bound = stated_bound(config, plan.noise_multiplier)
    if bound > config.budget_epsilon:
        cap = config.max_participations
        raise ConfigError(
            f"dp.noise_multiplier = {config.noise_multiplier:g} with "
            f"server.max_participations = {cap}: a client in {cap} group releases, each "
            f"carrying at least {plan.min_honest} honest Skellam shares (z = "
            f"{plan.noise_multiplier:.4g}), has epsilon {bound:.4g} > dp.epsilon = "
            f"{config.budget_epsilon:g} (delta {config.delta:g}, {config.accountant_name}); "
            "raise dp.noise_multiplier (0 calibrates it), lower server.max_participations, "
            "or raise dp.epsilon"
        )
    return bound
