"""Split a labelled training set across simulated clients.

``partition(labels, num_clients, scheme, seed, **params)`` returns one sorted int64
index array per client. Partitions are disjoint and cover every sample, and the
same arguments always give the same partition.

Schemes and their parameters (defaults in brackets):

- ``iid``: uniform shuffle, sizes differ by at most one.
- ``dirichlet`` (label skew): ``alpha`` [0.5], ``min_size`` [10], ``max_retries``
  [1000]. Per class, proportions ~ Dir(alpha); resampled until every client has
  ``min_size`` samples (Hsu et al. 2019; the NIID-Bench implementation).
- ``shards`` (pathological label skew, McMahan et al. 2017): ``shards_per_client``
  [2]. Samples sorted by label, cut into ``num_clients * shards_per_client``
  shards, each client takes random shards. Shards never straddle two labels when
  there are at least as many shards as labels, so a client sees at most
  ``shards_per_client`` labels (identical to McMahan's equal shards whenever the
  class sizes divide evenly, e.g. 100 clients on Fashion-MNIST).
- ``lognormal`` (quantity skew): ``sigma`` [1.0], ``min_size`` [1]. Sizes
  proportional to LogNormal(0, sigma) draws; labels IID.
- ``writer`` (FEMNIST-like): ``sigma`` [0.4], ``label_alpha`` [5.0], ``min_size``
  [1]. See :mod:`.writer_style`; the engine must also apply
  ``apply_writer_style(x[idx], client_id, seed)`` with the *same seed*.
"""

from __future__ import annotations

import heapq
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedveil.data.allocation import apportion, split_by_sizes
from fedveil.data.partition_report import format_partition_report, partition_report
from fedveil.data.writer_style import apply_writer_style, writer_partition, writer_style

__all__ = [
    "SCHEMES",
    "apply_writer_style",
    "format_partition_report",
    "partition",
    "partition_report",
    "writer_style",
]

Scheme = Callable[..., list[np.ndarray]]


def _require(name: str, value: Any, ok: bool, limit: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} must be {limit}")


def _check_min_size(min_size: int, num_clients: int, n: int) -> None:
    _require("min_size", min_size, isinstance(min_size, int | np.integer) and min_size >= 0, ">= 0")
    if min_size * num_clients > n:
        raise ValueError(
            f"min_size={min_size} x num_clients={num_clients} = {min_size * num_clients} "
            f"exceeds the {n} samples available; lower min_size or num_clients"
        )


def _iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return np.array_split(rng.permutation(len(labels)), num_clients)


def _dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    min_size: int = 10,
    max_retries: int = 1000,
) -> list[np.ndarray]:
    _require("alpha", alpha, math.isfinite(alpha) and alpha > 0, "finite and > 0")
    _require("max_retries", max_retries, max_retries >= 1, ">= 1")
    n = len(labels)
    _check_min_size(min_size, num_clients, n)
    by_class = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    for _ in range(max_retries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for members in by_class:
            members = rng.permutation(members)
            p = rng.dirichlet(np.full(num_clients, alpha))
            # Standard balancing trick: clients already above the mean size get no
            # more of this class, which keeps sizes from exploding at small alpha.
            p = p * (sizes < n / num_clients)
            p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(members)).astype(np.int64)[:-1]
            for k, chunk in enumerate(np.split(members, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
        if sizes.min() >= min_size:
            return [np.concatenate(p) for p in parts]
    raise ValueError(
        f"dirichlet: no partition with min_size={min_size} after max_retries={max_retries} "
        f"(alpha={alpha}, num_clients={num_clients}, {n} samples); raise alpha, lower "
        "min_size or num_clients, or raise max_retries"
    )


def _shards_per_class(class_sizes: np.ndarray, num_shards: int) -> np.ndarray:
    """Give every class one shard, then the rest greedily to the class whose shards are biggest."""
    shards = np.ones(len(class_sizes), dtype=np.int64)
    heap = [(-int(s), c) for c, s in enumerate(class_sizes) if s > 1]
    heapq.heapify(heap)
    for _ in range(num_shards - len(class_sizes)):
        _, c = heapq.heappop(heap)  # non-empty: num_shards <= number of samples
        shards[c] += 1
        if shards[c] < class_sizes[c]:
            heapq.heappush(heap, (-class_sizes[c] / shards[c], c))
    return shards


def _shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, shards_per_client: int = 2
) -> list[np.ndarray]:
    _require("shards_per_client", shards_per_client, shards_per_client >= 1, ">= 1")
    n, num_shards = len(labels), num_clients * shards_per_client
    if num_shards > n:
        raise ValueError(
            f"num_clients x shards_per_client = {num_shards} shards exceeds the {n} samples"
        )
    perm = rng.permutation(n)  # random order within a label, so shards differ by seed
    order = perm[np.argsort(labels[perm], kind="stable")]
    class_sizes = np.bincount(labels)
    if num_shards >= len(class_sizes):
        per_class = _shards_per_class(class_sizes, num_shards)
        blocks = split_by_sizes(order, class_sizes)
        shards = [s for b, k in zip(blocks, per_class, strict=True) for s in np.array_split(b, k)]
    else:  # fewer shards than labels: shards must straddle labels, as in the original
        shards = np.array_split(order, num_shards)
    owner = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.concatenate([shards[s] for s in row]) for row in owner]


def _lognormal(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    sigma: float = 1.0,
    min_size: int = 1,
) -> list[np.ndarray]:
    _require("sigma", sigma, math.isfinite(sigma) and sigma >= 0, "finite and >= 0")
    n = len(labels)
    _check_min_size(min_size, num_clients, n)
    weights = rng.lognormal(0.0, sigma, num_clients)
    sizes = min_size + apportion(n - min_size * num_clients, weights)
    return split_by_sizes(rng.permutation(n), sizes)


SCHEMES: dict[str, Scheme] = {
    "iid": _iid,
    "dirichlet": _dirichlet,
    "shards": _shards,
    "lognormal": _lognormal,
    "writer": writer_partition,
}


def _scheme_params(fn: Scheme) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]


def partition(
    labels: np.ndarray, num_clients: int, scheme: str, seed: int, **params: Any
) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` into ``num_clients`` disjoint arrays.

    ``labels`` may hold any integer class ids (they are re-encoded internally);
    a torch tensor on CPU also works. Raises ValueError naming the offending field.
    """
    fn = SCHEMES.get(scheme)
    if fn is None:
        raise ValueError(f"unknown scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}")
    accepted = _scheme_params(fn)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"scheme {scheme!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted) or 'none'}"
        )
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must have an integer dtype, got {y.dtype}")
    ok = isinstance(num_clients, int | np.integer) and not isinstance(num_clients, bool)
    _require("num_clients", num_clients, ok and num_clients >= 1, ">= 1")
    if num_clients > len(y):
        raise ValueError(f"num_clients={num_clients} exceeds the number of samples ({len(y)})")
    ok = isinstance(seed, int | np.integer) and not isinstance(seed, bool)
    _require("seed", seed, ok and seed >= 0, "a non-negative int")
    _, encoded = np.unique(y, return_inverse=True)  # arbitrary ids -> 0..C-1
    rng = np.random.default_rng(int(seed))
    parts = fn(encoded.reshape(-1), int(num_clients), rng, **params)
    return [np.sort(p).astype(np.int64, copy=False) for p in parts]
