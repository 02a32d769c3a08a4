"""The `[gossip]` checks: what a gossip run refuses, naming the field (called for every
run config by fedveil.config.run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.config.gossip import torus_shape
from fedveil.config.validator import ConfigError

if TYPE_CHECKING:
    from fedveil.config.run_schema import RunConfig


def check_gossip(cfg: RunConfig) -> None:
    """What a gossip run refuses, naming the field (called for every config)."""
    g, aggregation = cfg.gossip, cfg.server.aggregation
    if aggregation != "gossip":
        return
    if cfg.secagg.enabled:
        raise ConfigError(
            "server.aggregation = 'gossip' with secagg.enabled = true: refused. Secure "
            "aggregation hides each update inside a sum the coordinator computes; in "
            "gossip every neighbour receives a client's whole model, so there is no such "
            "sum to hide in. Use client.dp_sgd_noise (DP-SGD on each client) instead"
        )
    if cfg.dp.mechanism != "none":
        raise ConfigError(
            f"server.aggregation = 'gossip' with dp.mechanism = {cfg.dp.mechanism!r}: "
            "refused. Central and distributed DP noise a sum released by a coordinator; "
            "gossip has none, and a neighbour sees each client's model before any such "
            "noise. Use client.dp_sgd_noise (DP-SGD on each client, accounted per client)"
        )
    if cfg.transport != "inprocess" or cfg.server.mode != "sync":
        raise ConfigError(
            f"server.aggregation = 'gossip' with transport = {cfg.transport!r}, server.mode "
            f"= {cfg.server.mode!r}: gossip runs in the in-process engine, in sync rounds "
            "(transport = 'inprocess', server.mode = 'sync')"
        )
    if cfg.server.aggregator != "mean" or cfg.poisoning.attack != "none":
        raise ConfigError(
            "server.aggregation = 'gossip': server.aggregator and [poisoning] are not "
            "supported (the mixing step is a plain weighted mean)"
        )
    if g.degree and g.topology in ("ring", "torus"):
        fixed = 2 if g.topology == "ring" else 4
        if g.degree != fixed:
            raise ConfigError(
                f"gossip.degree = {g.degree} with gossip.topology = {g.topology!r}: a "
                f"{g.topology} has degree {fixed}; leave degree at 0 or set {fixed}"
            )
    n = cfg.data.num_clients
    if n < 2:
        raise ConfigError(f"server.aggregation = 'gossip' with data.num_clients = {n}: needs >= 2")
    if g.active > n:
        raise ConfigError(
            f"gossip.active = {g.active}: must be <= data.num_clients = {n} (0: every client)"
        )
    if g.degree >= n:
        raise ConfigError(
            f"gossip.degree = {g.degree}: must be < data.num_clients = {n} (no self loops)"
        )
    if g.topology == "random-regular" and (n * (g.degree or 4)) % 2:
        raise ConfigError(
            f"gossip.degree = {g.degree or 4} with data.num_clients = {n}: a random regular "
            "graph needs n x degree even"
        )
    if g.topology == "torus" and torus_shape(n) is None:
        raise ConfigError(
            f"gossip.topology = 'torus' with data.num_clients = {n}: needs n = rows x cols "
            "with rows, cols >= 3 (e.g. 100 = 10 x 10)"
        )
