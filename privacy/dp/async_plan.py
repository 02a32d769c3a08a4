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
check_wall_clock_dp says why). The run config refuses them when it loads, with the
full explanation; `check_async_invariants` refuses them here again, from the plain
parameters (fedveil.protocol.dp_parameters), so that no plan is built without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.config.validator import ConfigError
from fedveil.protocol.dp_parameters import DpParameters
from fedveil.protocol.dp_rules import (
    ADD_REMOVE,
    AUTO,
    DISTRIBUTED_SKELLAM,
    MECHANISM_OF_CONFIG,
    PLD,
    POISSON,
    RDP,
    REPLACE_ONE,
    SKELLAM_RDP_INTEGER,
    ZERO_OUT,
)

from .calibration import calibrate_noise_multiplier
from .config import DpConfig
from .participation import cap_bound

if TYPE_CHECKING:
    from .distributed_plan import DistributedDpPlan


def check_async_invariants(p: DpParameters) -> None:
    """What an asynchronous DP plan needs, or a ConfigError naming the field: a cap of
    at least one participation, no adaptive clipping, and no add/remove adjacency."""
    if p.max_participations < 1:
        raise ConfigError(
            f"server.max_participations = {p.max_participations}: must be >= 1 with "
            f"dp.mechanism = {p.mechanism!r} and server.mode = {p.mode!r} (unsampled "
            "releases compose without bound unless capped)"
        )
    if p.adaptive_clipping:
        raise ConfigError(
            f"dp.adaptive_clipping = true with server.mode = {p.mode!r}: refused (its "
            "count release is calibrated to a sampled cohort)"
        )
    if p.neighbouring == ADD_REMOVE:
        raise ConfigError(
            f"dp.neighbouring = 'add_remove' with server.mode = {p.mode!r}: refused (a "
            "buffer slot freed by a removed client is filled by another: a replacement)"
        )


def async_neighbouring(p: DpParameters) -> str:
    """dp.neighbouring, 'auto' resolved: zero-out."""
    return ZERO_OUT if p.neighbouring == AUTO else p.neighbouring


def async_accountant(p: DpParameters, neighbouring: str) -> str:
    """dp.accountant, 'auto' resolved: distributed DP's only sound one (skellam_rdp_integer);
    for central DP Opacus' RDP under zero-out, PLD under replace-one (Opacus does not
    model replace-one's 2C distance)."""
    if p.accountant != AUTO:
        return p.accountant
    if MECHANISM_OF_CONFIG[p.mechanism] == DISTRIBUTED_SKELLAM:
        return SKELLAM_RDP_INTEGER
    return PLD if neighbouring == REPLACE_ONE else RDP


def async_dp_config(p: DpParameters, num_clients: int) -> DpConfig:
    """The DP layer's config of an asynchronous run: unsampled releases (q = 1), capped at
    server.max_participations; z calibrated so that the cap meets dp.epsilon when
    dp.noise_multiplier = 0. Raises ConfigError when the cap-based bound exceeds dp.epsilon
    or the accounting cannot be stated (check_async_invariants)."""
    check_async_invariants(p)
    cap = p.max_participations
    neighbouring = async_neighbouring(p)
    accountant = async_accountant(p, neighbouring)
    mechanism = MECHANISM_OF_CONFIG[p.mechanism]
    z = float(p.noise_multiplier)
    try:
        if z == 0:
            z = calibrate_noise_multiplier(
                p.epsilon,
                p.delta,
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
            clip_norm=p.clip_norm,
            sampling_rate=1.0,
            rounds=cap,
            delta=p.delta,
            budget_epsilon=p.epsilon,
            sampling=POISSON,
            neighbouring=neighbouring,
            population_size=num_clients,
            accountant=accountant,
            modulus_bits=p.modulus_bits,
            max_participations=cap,
        )
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(
            f"dp.accountant = {p.accountant!r} with server.mode = {p.mode!r}: {error}"
        ) from None
    bound = stated_bound(config)
    if not bound <= p.epsilon:  # NaN fails closed
        raise ConfigError(
            f"dp.noise_multiplier = {z:g} with server.max_participations = {cap}: a client "
            f"in {cap} unsampled releases has epsilon {bound:.4g} > dp.epsilon = "
            f"{p.epsilon:g} (delta {p.delta:g}, {config.accountant_name}); raise "
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
    if not bound <= config.budget_epsilon:  # NaN fails closed
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
