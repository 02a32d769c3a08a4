"""The bounds of the robust aggregators (`server.aggregator`) and the config's checks.

How many attackers f each rule tolerates among n updates (server/engine/robust.py has
the rules and their papers): median n >= 2f + 1; trimmed mean k >= f trimmed per side
and n >= 2k + 1; Krum and Multi-Krum n >= 2f + 3; Bulyan n >= 4f + 3; norm bounding
and the mean tolerate no fixed f. Here in the core so the run config can refuse a
cohort too small for its f before anything runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fedveil.config.validator import ConfigError

if TYPE_CHECKING:
    from fedveil.config.run_schema import RunConfig


def trimmed_per_side(n: int, f: int, trim_fraction: float) -> int:
    """How many values trimmed mean drops per side with n updates: f, or
    floor(trim_fraction x n) when a fraction is set."""
    return f if trim_fraction == 0 else math.floor(trim_fraction * n)


def bound_holds(aggregator: str, n: int, f: int, trim_fraction: float = 0.0) -> bool:
    """Whether `aggregator` tolerates f attackers among n updates (module table)."""
    if n < 1:
        return False
    if aggregator in ("mean", "norm_bound"):
        return f == 0
    if aggregator == "median":
        return n >= 2 * f + 1
    if aggregator == "trimmed_mean":
        k = trimmed_per_side(n, f, trim_fraction)
        return k >= f and n >= 2 * k + 1
    if aggregator in ("krum", "multi_krum"):
        return n >= 2 * f + 3
    if aggregator == "bulyan":
        return n >= 4 * f + 3
    raise ValueError(f"server.aggregator = {aggregator!r}: unknown")


def min_cohort(aggregator: str, f: int, trim_fraction: float = 0.0) -> int:
    """The fewest updates for which `aggregator` tolerates f attackers."""
    if aggregator in ("mean", "norm_bound", "median"):
        return 2 * f + 1 if aggregator == "median" else 1
    if aggregator in ("krum", "multi_krum"):
        return 2 * f + 3
    if aggregator == "bulyan":
        return 4 * f + 3
    if aggregator == "trimmed_mean":
        n = 2 * f + 1
        if trim_fraction > 0:
            n = max(n, math.ceil(f / trim_fraction) - 1)
        while not bound_holds(aggregator, n, f, trim_fraction):
            n += 1
        return n
    raise ValueError(f"server.aggregator = {aggregator!r}: unknown")


def largest_tolerated(aggregator: str, n: int, f: int, trim_fraction: float = 0.0) -> int:
    """The largest f' <= f that `aggregator` tolerates among n updates (0 at least)."""
    while f > 0 and not bound_holds(aggregator, n, f, trim_fraction):
        f -= 1
    return f


def check_robust_config(cfg: RunConfig) -> None:
    """The `server.aggregator` settings against each other, the cohort, DP and secure
    aggregation (ConfigError naming the fields)."""
    s = cfg.server
    agg, f = s.aggregator, s.attackers_tolerated
    if agg == "mean":
        if f > 0:
            raise ConfigError(
                f"server.attackers_tolerated = {f} with server.aggregator = 'mean': the mean "
                "tolerates no attacker; choose median, trimmed_mean, krum, multi_krum or bulyan"
            )
        _unused(s.trim_fraction, s.krum_select, s.norm_bound, s.weak_dp_noise, agg)
        return
    _check_rule_parameters(cfg, agg, f)
    _refuse_with_privacy(cfg, agg)
    _check_cohort(cfg, agg, f)


def _check_rule_parameters(cfg: RunConfig, agg: str, f: int) -> None:
    """Each rule's own parameters, and none of another rule's."""
    s = cfg.server
    if agg == "norm_bound":
        if s.norm_bound <= 0:
            raise ConfigError(
                "server.aggregator = 'norm_bound' needs server.norm_bound > 0 (the L2 bound M)"
            )
        if f > 0:
            raise ConfigError(
                f"server.attackers_tolerated = {f} with server.aggregator = 'norm_bound': "
                "norm bounding limits each client's pull but tolerates no fixed number of "
                "attackers; set it to 0"
            )
    elif s.norm_bound > 0 or s.weak_dp_noise > 0:
        raise ConfigError(
            f"server.norm_bound / server.weak_dp_noise are set with server.aggregator = "
            f"{agg!r}: they apply to aggregator = 'norm_bound' only"
        )
    if s.trim_fraction > 0 and agg != "trimmed_mean":
        raise ConfigError(
            f"server.trim_fraction = {s.trim_fraction} with server.aggregator = {agg!r}: "
            "it applies to aggregator = 'trimmed_mean' only"
        )
    if s.krum_select > 0 and agg != "multi_krum":
        raise ConfigError(
            f"server.krum_select = {s.krum_select} with server.aggregator = {agg!r}: "
            "it applies to aggregator = 'multi_krum' only"
        )


def _refuse_with_privacy(cfg: RunConfig, agg: str) -> None:
    """A robust rule is not a sum: neither DP accounting nor secure aggregation covers it."""
    if cfg.dp.mechanism != "none":
        raise ConfigError(
            f"server.aggregator = {agg!r} with dp.mechanism = {cfg.dp.mechanism!r}: a robust "
            "aggregator is not a sum, and fedveil's DP accounting covers only a sum of "
            "clipped updates; no sound analysis for it is implemented (weak DP is not one). "
            "Use server.aggregator = 'mean' with DP"
        )
    if cfg.secagg.enabled:
        raise ConfigError(
            f"server.aggregator = {agg!r} with secagg.enabled = true: under secure "
            "aggregation the server sees only the sum, so it cannot compute a robust "
            "aggregate; use server.aggregator = 'mean'"
        )


def _check_cohort(cfg: RunConfig, agg: str, f: int) -> None:
    """The cohort (fixed, or the expected Poisson one) is large enough for the rule's bound."""
    s = cfg.server
    expected = cfg.poisson_rate * cfg.data.num_clients
    need = min_cohort(agg, f, s.trim_fraction)
    if s.sampling == "fixed":
        if not bound_holds(agg, s.per_round, f, s.trim_fraction):
            raise ConfigError(
                f"server.per_round = {s.per_round} is too small for server.aggregator = "
                f"{agg!r} with server.attackers_tolerated = {f}: needs >= {need}"
            )
    else:
        expected = cfg.poisson_rate * cfg.data.num_clients
        if expected < need:
            raise ConfigError(
                f"expected Poisson cohort {expected:g} (server.sample_rate x "
                f"data.num_clients) is too small for server.aggregator = {agg!r} with "
                f"server.attackers_tolerated = {f}: needs >= {need}"
            )
    if agg == "multi_krum" and s.krum_select > 0:
        cohort = s.per_round if s.sampling == "fixed" else math.floor(expected)
        if s.krum_select > cohort - f:
            raise ConfigError(
                f"server.krum_select = {s.krum_select}: must be <= cohort - "
                f"server.attackers_tolerated = {cohort - f}"
            )


def _unused(trim: float, select: int, bound: float, noise: float, agg: str) -> None:
    for name, value in (
        ("trim_fraction", trim),
        ("krum_select", select),
        ("norm_bound", bound),
        ("weak_dp_noise", noise),
    ):
        if value:
            raise ConfigError(
                f"server.{name} = {value} with server.aggregator = {agg!r}: it has no effect "
                "there; choose the aggregator it belongs to"
            )
