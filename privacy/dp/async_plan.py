"""The DP plan of an asynchronous (server.mode = 'async' or 'ssp') run, or its refusal.

Asynchronous participation is not sampled, so nothing is amplified (q = 1), and a
client's releases compose without bound unless capped: DP requires
server.max_participations P. Central DP only: the server adds N(0, (zC)^2) to each
released sum; every client is in at most P releases, so its epsilon is at most the
P-fold composition of that Gaussian (participation.py), accounted with Opacus' RDP by
default. The bound is stated before the run, and a config whose bound exceeds
dp.epsilon is refused here, before any data is loaded (z = 0 calibrates z to it).

Adjacency: zero-out (the target's updates replaced by zeros). Which clients fill a
buffer depends on availability, not data; under add/remove, removing a client would
put another client's update in its slot (a replacement, sensitivity 2C), which the
add/remove shift does not cover, so add/remove is refused. replace_one is accepted
(sensitivity 2C, accounted with PLD).

Refused, because no accounting for them is stated here (each refusal names the field):
distributed DP (Skellam noise shares per secure-aggregation group: the group's honest
threshold at its deadline and the per-client accounting of group releases are not
derived), adaptive clipping (its count release is calibrated to a sampled cohort),
and a missing cap.
"""

from __future__ import annotations

from fedveil.config import ConfigError, RunConfig
from fedveil.config.async_dp import (
    async_neighbouring,
    check_async_dp,
    participation_cap,
    server_mode,
)

from .calibration import calibrate_noise_multiplier
from .config import DpConfig
from .participation import cap_bound
from .plan import MECHANISM_NAMES
from .vocabulary import PLD, POISSON, RDP, REPLACE_ONE


def async_accountant(cfg: RunConfig, neighbouring: str) -> str:
    """dp.accountant, 'auto' resolved: Opacus' RDP under zero-out, PLD under replace-one
    (Opacus does not model replace-one's 2C distance)."""
    if cfg.dp.accountant != "auto":
        return cfg.dp.accountant
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


def stated_bound(config: DpConfig) -> float:
    """The bound stated before the run: a client in `max_participations` releases."""
    assert config.max_participations is not None
    return cap_bound(
        config.round_event(), config.max_participations, config.delta, config.accountant_name
    )
