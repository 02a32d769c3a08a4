"""DP settings under server.mode = 'async' | 'ssp', checked when the config loads.

Pure config (no accountant): refuses what cannot be accounted, naming the field and
why. The accounting itself (cap-based bound, budget refusal, each secure-aggregation
group's distributed-DP plan) is fedveil.privacy.dp.async_plan; docs/how-to/async-training.md
explains it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.config.validator import ConfigError

if TYPE_CHECKING:
    from fedveil.config.run_schema import RunConfig

ZERO_OUT = "zero_out"

SYNC = "sync"


def server_mode(cfg: RunConfig) -> str:
    """server.mode ('sync' when the setting does not exist yet)."""
    return str(getattr(cfg.server, "mode", SYNC))


def is_async(cfg: RunConfig) -> bool:
    """True for the modes without sampled cohorts ('async', 'ssp')."""
    return server_mode(cfg) != SYNC


def participation_cap(cfg: RunConfig) -> int:
    """server.max_participations (0: no cap)."""
    return int(getattr(cfg.server, "max_participations", 0) or 0)


def async_neighbouring(cfg: RunConfig) -> str:
    chosen = cfg.dp.neighbouring
    if chosen == "add_remove":
        raise ConfigError(
            f"dp.neighbouring = 'add_remove' with server.mode = {server_mode(cfg)!r}: removing "
            "a client puts another client's update in its buffer slot (a replacement, "
            "sensitivity 2C), which add/remove does not cover; use 'auto' (zero_out) or "
            "'replace_one'"
        )
    return ZERO_OUT if chosen == "auto" else chosen


def check_async_dp(cfg: RunConfig) -> None:
    """Refuse an asynchronous DP config whose accounting cannot be stated (ConfigError
    naming the field and why). Does nothing without DP or in sync mode. Central DP and
    distributed DP (Skellam shares per secure-aggregation group) both need the cap."""
    dp, mode = cfg.dp, server_mode(cfg)
    if dp.mechanism == "none" or mode == SYNC:
        return
    if dp.adaptive_clip:
        raise ConfigError(
            f"dp.adaptive_clip = true with server.mode = {mode!r}: refused, its clip-count "
            "release is calibrated to a sampled cohort (sigma_b = cohort / 20) and its "
            "accounting under asynchronous releases is not stated; use a fixed dp.clip"
        )
    cap = participation_cap(cfg)
    if cap < 1:
        raise ConfigError(
            f"dp.mechanism = {dp.mechanism!r} with server.mode = {mode!r} needs a cap: "
            f"server.max_participations = {cap}, must be >= 1. Asynchronous participation "
            "is not sampled (no amplification), so without a cap a client's releases "
            "compose without bound and no epsilon can be stated"
        )
    async_neighbouring(cfg)


def check_wall_clock_dp(cfg: RunConfig) -> None:
    """Refuse distributed DP for an asynchronous run on devices (the wall clock), naming
    dp.mechanism: its group sessions run at once on threads of their own, while the
    distributed-DP stage (each group's survivor check and ledger entry) and the Skellam
    encoding's per-session rotation are written for one session at a time; and devices
    are not sent the settings (server.mode, group_size, max_participations) a group's
    plan is computed from, so they could not hold it."""
    if cfg.dp.mechanism == "distributed" and is_async(cfg):
        raise ConfigError(
            f"dp.mechanism = 'distributed' with server.mode = {server_mode(cfg)!r} on devices: "
            "refused; on the wall clock a run's secure-aggregation groups run at once, and "
            "their unmask gate, ledger entries and Skellam rotation are not yet made safe "
            "for concurrent sessions, nor do devices receive the settings a group's "
            "noise-share plan comes from (server.group_size, server.max_participations); "
            "use dp.mechanism = 'central', or simulate it (fedveil simulate)"
        )
