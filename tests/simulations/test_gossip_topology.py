"""Gossip graphs and their Metropolis-Hastings matrices (simulations/gossip/topology.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.config import ConfigError, load_config
from fedveil.simulations.gossip.mixing import average, consensus_distance, mix
from fedveil.simulations.gossip.topology import (
    active_mixing,
    build_graph,
    bytes_sent,
    metropolis_hastings,
    spectral_gap,
)

TOPOLOGIES = ["ring", "torus", "exponential", "random-regular"]


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_mixing_matrix_is_symmetric_doubly_stochastic(name: str) -> None:
    graph = build_graph(name, 100, 0, seed=3)
    w = metropolis_hastings(graph).dense()
    assert np.allclose(w, w.T)
    assert np.allclose(w.sum(axis=0), 1.0) and np.allclose(w.sum(axis=1), 1.0)
    assert (w >= 0).all()
    for i, nb in enumerate(graph):  # weights exactly on the edges and the diagonal
        assert i not in nb and all(i in graph[j] for j in nb)
        assert set(np.flatnonzero(w[i])) == {i, *nb}


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_active_mixing_is_doubly_stochastic_on_the_awake_clients_edges(name: str) -> None:
    """Randomized gossip: only edges touching an awake client mix, and the matrix stays
    symmetric and doubly stochastic (the average of the models never moves)."""
    graph = build_graph(name, 100, 0, seed=3)
    awake = [3, 17, 40, 41, 77]
    mixing = active_mixing(graph, awake)
    w = mixing.dense()
    assert np.allclose(w, w.T)
    assert np.allclose(w.sum(axis=0), 1.0) and np.allclose(w.sum(axis=1), 1.0)
    assert (w >= 0).all()
    for i, nb in enumerate(graph):
        touching = {j for j in nb if i in awake or j in awake}
        assert set(np.flatnonzero(w[i])) == {i, *touching}
    x = torch.randn(100, 7)
    assert torch.allclose(average(mix(x, mixing)), average(x), atol=1e-6)
    asleep = [i for i in range(100) if i not in awake and not set(graph[i]) & set(awake)]
    assert asleep and torch.equal(mix(x, mixing)[asleep], x[asleep])
    sent = bytes_sent(mixing, 10)
    assert sent[3] == len(graph[3]) * 40 and all(sent[i] == 0 for i in asleep)


def test_degrees_of_each_topology() -> None:
    assert {len(nb) for nb in build_graph("ring", 100)} == {2}
    assert {len(nb) for nb in build_graph("torus", 100)} == {4}
    assert {len(nb) for nb in build_graph("random-regular", 100, 6, seed=1)} == {6}
    # offsets +-1, 2, 4, 8, 16, 32
    assert build_graph("exponential", 100)[0] == [1, 2, 4, 8, 16, 32, 68, 84, 92, 96, 98, 99]
    assert build_graph("random-regular", 100, 4, seed=1) == build_graph(
        "random-regular", 100, 4, seed=1
    )
    assert build_graph("random-regular", 100, 4, seed=1) != build_graph(
        "random-regular", 100, 4, seed=2
    )


def test_spectral_gap_orders_the_topologies() -> None:
    gaps = {t: spectral_gap(metropolis_hastings(build_graph(t, 100, 0, 0))) for t in TOPOLOGIES}
    # A ring of n mixes in O(n^2) steps: its gap is 1 - (1 + 2 cos(2 pi / n)) / 3.
    assert gaps["ring"] == pytest.approx((2 - 2 * np.cos(2 * np.pi / 100)) / 3, rel=1e-6)
    assert gaps["ring"] < gaps["torus"] < gaps["exponential"]
    assert gaps["ring"] < gaps["random-regular"]


def test_mixing_keeps_the_average_and_contracts_to_it() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 300)
    mixing = metropolis_hastings(build_graph("exponential", 64))
    w = torch.tensor(mixing.dense(), dtype=torch.float32)
    y = mix(x, mixing)
    assert torch.allclose(y, w @ x, atol=1e-5)
    assert torch.allclose(average(y), average(x), atol=1e-6)
    gap = spectral_gap(mixing)
    # One step shrinks the deviations from the average by at least (1 - gap) in norm.
    dev = lambda t: float((t - average(t)).norm())  # noqa: E731
    assert dev(y) <= (1 - gap) * dev(x) * (1 + 1e-5)
    assert consensus_distance(y) < consensus_distance(x)


def test_bytes_sent_is_a_model_per_neighbour() -> None:
    graph = build_graph("torus", 16)
    assert bytes_sent(graph, 1000) == [4 * 4000] * 16


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"secagg.enabled": True}, "secagg.enabled"),
        ({"dp.mechanism": "central", "dp.epsilon": 4.0}, "dp.mechanism"),
        ({"gossip.topology": "ring", "gossip.degree": 4}, "gossip.degree"),
        ({"gossip.topology": "torus", "data.num_clients": 13}, "gossip.topology"),
        (
            {"gossip.topology": "random-regular", "gossip.degree": 3, "data.num_clients": 11},
            "gossip.degree",
        ),
        ({"transport": "flower"}, "transport"),
    ],
)
def test_gossip_refuses_what_it_cannot_honour(settings: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, {"server.aggregation": "gossip", **settings})


def test_gossip_config_accepts_a_small_population() -> None:
    # Every client trains each round: the cohort size of a coordinator run is not checked.
    cfg = load_config(None, {"server.aggregation": "gossip", "data.num_clients": 12})
    assert cfg.gossip.topology == "exponential" and cfg.gossip.mixing == "metropolis-hastings"
