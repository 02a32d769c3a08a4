"""`[gossip]`: decentralised training over a graph (server.aggregation = "gossip").

Each client keeps its own model, trains it, then averages it with its neighbours'
(simulations/gossip/). The graph and the mixing rule live here; the checks refuse
what gossip cannot honour: secure aggregation and central or distributed DP protect
a sum only a coordinator sees, while in gossip every neighbour sees a client's model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedveil.config.validator import spec

# server.aggregation: who sums the updates (allreduce: fedveil/config/allreduce_checks.py).
AGGREGATIONS = ("coordinator", "allreduce", "gossip")
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
    active: int = spec(
        0,
        lo=0,
        hi=1_000_000,
        help="clients that wake each round (randomized gossip, Boyd et al. 2006): they train, "
        "then mix over the edges that touch them; 0: every client, every round (D-PSGD)",
    )
    momentum: float = spec(
        0.0,
        lo=0.0,
        hi=0.99,
        help="quasi-global momentum beta (QG-DSGDm, Lin et al. 2021): each client keeps a "
        "buffer of its model's displacement over the rounds it trains and adds beta x it "
        "to its next step; 0: plain gossip (D-PSGD)",
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


def torus_shape(n: int) -> tuple[int, int] | None:
    """The most nearly square rows x cols = n with both >= 3 (None: no such grid)."""
    best = None
    for rows in range(3, int(n**0.5) + 1):
        if n % rows == 0 and n // rows >= 3:
            best = (rows, n // rows)
    return best
