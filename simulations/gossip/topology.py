"""Communication graphs for gossip and their Metropolis-Hastings mixing matrices.

Contract: `build_graph(name, n, degree, seed)` returns each client's neighbours
(sorted, symmetric, no self loops, connected: a disconnected graph never reaches
consensus, so it is refused). `metropolis_hastings(graph)` returns the mixing
weights as a `Mixing`: w_ij = 1 / (1 + max(d_i, d_j)) for each edge and
w_ii = 1 - sum_j w_ij, a symmetric doubly stochastic matrix whatever the degrees.
`spectral_gap(mixing)` is 1 - |lambda_2|: how fast gossip contracts towards the
average (consensus distance shrinks by about (1 - gap) per mixing step).

The random-regular graph is drawn from the run's seed, not the OS CSPRNG: it is
public (every client must know its neighbours) and no guarantee rests on it, and
a run must be reproducible from its directory.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedveil.config.gossip import torus_shape

Graph = list[list[int]]
# Draws before a random regular graph is given up on.
_REGULAR_TRIES = 200


def default_degree(name: str, n: int) -> int:
    """The degree a topology gets when gossip.degree is 0."""
    if name == "ring":
        return 2
    if name == "torus":
        return 4
    if name == "exponential":
        return 2 * max(1, math.floor(math.log2(max(n - 1, 1))))
    return min(4, n - 1)


def build_graph(name: str, n: int, degree: int = 0, seed: int = 0) -> Graph:
    """Each client's neighbours. `degree` 0: the topology's default."""
    if n < 2:
        raise ValueError(f"gossip needs >= 2 clients, got {n}")
    degree = degree or default_degree(name, n)
    if name == "ring":
        sets = [{(i - 1) % n, (i + 1) % n} for i in range(n)]
    elif name == "torus":
        shape = torus_shape(n)
        if shape is None:
            raise ValueError(f"torus: {n} clients are not rows x cols with both >= 3")
        sets = _torus(*shape)
    elif name == "exponential":
        sets = _exponential(n, degree)
    elif name == "random-regular":
        sets = _random_regular(n, degree, seed)
    else:
        raise ValueError(f"unknown topology {name!r}")
    graph = [sorted(s - {i}) for i, s in enumerate(sets)]
    if not _connected(graph):
        raise ValueError(f"{name} graph on {n} clients (degree {degree}) is not connected")
    return graph


def _torus(rows: int, cols: int) -> list[set[int]]:
    def at(r: int, c: int) -> int:
        return (r % rows) * cols + c % cols

    return [
        {at(r - 1, c), at(r + 1, c), at(r, c - 1), at(r, c + 1)}
        for r in range(rows)
        for c in range(cols)
    ]


def _exponential(n: int, degree: int) -> list[set[int]]:
    """Neighbours at offsets +-2^k, k < degree / 2 (an undirected exponential graph:
    O(log n) hops between any two clients, so its spectral gap stays large)."""
    hops = max(1, degree // 2)
    offsets = [2**k for k in range(hops) if 2**k < n]
    return [{(i + o) % n for o in offsets} | {(i - o) % n for o in offsets} for i in range(n)]


def _random_regular(n: int, degree: int, seed: int) -> list[set[int]]:
    """A random simple D-regular graph (Steger-Wormald pairing: stubs are paired at
    random, a pair that would make a loop or a double edge goes back to be re-paired;
    a draw that gets stuck, or is disconnected, is drawn again)."""
    if not 1 <= degree < n or (n * degree) % 2:
        raise ValueError(f"random-regular: degree {degree} with {n} clients (need n x D even)")
    rng = np.random.default_rng([seed, 0x6055])
    for _ in range(_REGULAR_TRIES):
        sets: list[set[int]] = [set() for _ in range(n)]
        stubs = np.repeat(np.arange(n), degree)
        while len(stubs):
            left = []
            for a, b in rng.permutation(stubs).reshape(-1, 2).tolist():
                if a == b or b in sets[a]:
                    left += [a, b]
                else:
                    sets[a].add(b)
                    sets[b].add(a)
            if len(left) == len(stubs):
                break  # stuck: no pair left can be joined
            stubs = np.asarray(left, dtype=np.int64)
        if not len(stubs) and _connected([sorted(s) for s in sets]):
            return sets
    raise ValueError(
        f"random-regular: no simple connected {degree}-regular graph on {n} clients "
        f"in {_REGULAR_TRIES} draws; choose a smaller degree"
    )


def _connected(graph: Graph) -> bool:
    seen = {0}
    todo = deque([0])
    while todo:
        for j in graph[todo.popleft()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(graph)


@dataclass(frozen=True)
class Mixing:
    """A mixing matrix in padded neighbour-slot form.

    Row i's new model is self_weight[i] * x_i + sum_k weight[i, k] * x_{index[i, k]};
    unused slots have weight 0 and point at i. The slot order is fixed, so every
    process that mixes a row does the same arithmetic in the same order.
    """

    graph: Graph
    self_weight: torch.Tensor  # (n,) float64
    index: torch.Tensor  # (n, max_degree) int64
    weight: torch.Tensor  # (n, max_degree) float64

    @property
    def n(self) -> int:
        return len(self.graph)

    def dense(self) -> np.ndarray:
        """The n x n matrix (for analysis and tests; never used to mix)."""
        w = np.zeros((self.n, self.n))
        w[np.arange(self.n), np.arange(self.n)] = self.self_weight.numpy()
        index, weight = self.index.numpy(), self.weight.numpy()
        for i in range(self.n):
            for k in range(index.shape[1]):  # an unused slot points at i with weight 0
                w[i, index[i, k]] += weight[i, k]
        return w


def metropolis_hastings(graph: Graph) -> Mixing:
    """w_ij = 1 / (1 + max(d_i, d_j)) on edges, the rest on the diagonal."""
    n = len(graph)
    width = max(1, max(len(nb) for nb in graph))
    index = torch.arange(n).unsqueeze(1).repeat(1, width)
    weight = torch.zeros(n, width, dtype=torch.float64)
    self_weight = torch.ones(n, dtype=torch.float64)
    for i, nb in enumerate(graph):
        for k, j in enumerate(nb):
            w = 1.0 / (1 + max(len(nb), len(graph[j])))
            index[i, k], weight[i, k] = j, w
            self_weight[i] -= w
    return Mixing(graph, self_weight, index, weight)


def active_mixing(graph: Graph, active: Sequence[int]) -> Mixing:
    """Metropolis-Hastings over the edges that touch an awake client (randomized gossip,
    Boyd et al. 2006; asynchronous D-PSGD, Lian et al. 2018): an awake client averages
    with each neighbour, awake or not, and an edge between two sleeping clients carries
    nothing. Degrees are counted in that subgraph, so the matrix is still symmetric and
    doubly stochastic: mixing never moves the average. A client no edge touches keeps
    its model (self weight 1)."""
    awake = set(active)
    sub = [[j for j in nb if i in awake or j in awake] for i, nb in enumerate(graph)]
    mixing = metropolis_hastings(sub)
    return Mixing(graph, mixing.self_weight, mixing.index, mixing.weight)


def spectral_gap(mixing: Mixing) -> float:
    """1 - |lambda_2| of the (symmetric) mixing matrix."""
    eig = np.sort(np.abs(np.linalg.eigvalsh(mixing.dense())))[::-1]
    return float(1.0 - eig[1]) if len(eig) > 1 else 1.0


def bytes_sent(mixing: Mixing | Graph, model_size: int, itemsize: int = 4) -> list[int]:
    """Bytes each client sends in one mixing step: its model to every neighbour it mixes
    with (a slot of nonzero weight; for a plain graph, every neighbour)."""
    if isinstance(mixing, Mixing):
        counts = (mixing.weight > 0).sum(dim=1).tolist()
        return [int(c) * model_size * itemsize for c in counts]
    return [len(nb) * model_size * itemsize for nb in mixing]
