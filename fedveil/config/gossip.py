"""`[gossip]`: decentralised training over a graph (server.aggregation = "gossip").

Each client keeps its own model, trains it, then averages it with its neighbours'
(simulations/gossip/). The graph and the mixing rule live here; the checks refuse
what gossip cannot honour: secure aggregation and central or distributed DP protect
a sum only a coordinator sees, while in gossip every neighbour sees a client's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedveil.config.validator import ConfigError, spec

if TYPE_CHECKING:
    from fedveil.config.run_schema import RunConfig

AGGREGATIONS = ("coordinator", "gossip")
TOPOLOGIES = ("ring", "torus", "exponential", "random-regular")


@dataclass
class GossipConfig:
    """The communication graph and mixing matrix of a gossip run."""

    topology: str = spec(
        "exponential",
        choices=TOPOLOGIES,
        help="graph: ring (2 neighbours), torus (2-D grid with wrap-around, 4), exponential "
        "(neighbours at +-2^k, k < degree / 2), random-regular (degree D, a seeded draw)",
    )
    degree: int = spec(
        0,
        lo=0,
        hi=1024,
        help="neighbours per client; 0: the topology's own (ring 2, torus 4, exponential "
        "2 floor(log2(n - 1)), random-regular 4); set for exponential and random-regular only",
    )
    mixing: str = spec(
        "metropolis-hastings",
        choices=("metropolis-hastings",),
        help="mixing weights: w_ij = 1 / (1 + max(d_i, d_j)), w_ii = 1 - sum (doubly stochastic)",
    )
    spread_clients: int = spec(
        10,
        lo=0,
        hi=10_000,
        help="clients whose own model is evaluated each round (their accuracies' spread)",
    )
    spread_examples: int = spec(
        2000, lo=1, hi=1_000_000, help="test examples each of those client models is scored on"
    )


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


def torus_shape(n: int) -> tuple[int, int] | None:
    """The most nearly square rows x cols = n with both >= 3 (None: no such grid)."""
    best = None
    for rows in range(3, int(n**0.5) + 1):
        if n % rows == 0 and n // rows >= 3:
            best = (rows, n // rows)
    return best
