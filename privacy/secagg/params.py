"""Choose the neighbour degree k and Shamir threshold t from a threat model.

Model (Bell et al., CCS 2020, "SecAgg+"; the search mirrors the idea of Google's
federated-compute graph parameter finder, re-derived and written with exact integer tails):

* n clients, a fraction γ of them corrupt (colluding with the server), a fraction δ drop out.
  The counts used are A = ⌊γn⌋ corrupt, D = ⌊δn⌋ dropped, S_n = ⌈(1-δ)n⌉ surviving.
* The neighbour graph is a Harary graph H(k, n) (ring, k/2 neighbours on each side) laid over a
  uniformly random permutation of the cohort. A client's neighbourhood is then a uniform random
  k-subset of the others, so the number of corrupt neighbours is ~ Hypergeometric(n, A, k) and
  the number of surviving neighbours ~ Hypergeometric(n, S_n, k).
* Each client Shamir-shares its secrets among its k neighbours and itself (k + 1 holders).

The finder walks even k = 2, 4, ... and accepts the first k for which all three hold, with
σ = 40 (security) and η = 20 (correctness) bits, the σ budget split over two bad events:

1. Connectivity: removing the A + D bad clients leaves the honest survivors connected.
   A Harary graph only disconnects if two disjoint runs of k/2 consecutive ring positions are
   all bad; a union bound over the n(n-k-1)/2 run pairs gives
   P ≤ n(n-k-1)/2 · (A)_k / (n)_k  <  2^-(σ+1)      [(x)_k is the falling factorial].
2. Security: t1 = the smallest x with P[corrupt neighbours > x] ≤ 2^-(σ+1) / n (union over
   clients). Semi-honest: t = max(t1 + 1, 2). Malicious server: honest holders reveal one kind
   of share per peer, so the server gets both kinds for a victim only if 2t ≤ k + 1 + t1;
   we require 2t > k + 1 + t1, i.e. t = ⌊(k + 1 + t1) / 2⌋ + 1.
3. Correctness: t ≤ t_max, the largest t with P[surviving neighbours < t] ≤ 2^-η / n.

All tails are computed exactly with integer binomials (no floating point, no Chernoff
approximation). Reference values this reproduces: n = 1000, γ = 5 %, δ = 10 % → k = 36, t = 19;
γ = 5 %, δ = 30 % → k = 66, t = 23; n = 10^6, 5 % / 10 % → k = 50, t = 25.

Limits: semi-honest needs γ + δ ≤ 0.9, malicious needs γ + 2δ ≤ 0.9 (outside, a `ValueError`
is raised: no degree can work). Small cohorts (n ≤ `COMPLETE_GRAPH_MAX_N`, or when no Harary
degree below n - 1 satisfies the bounds) use the complete graph k = n - 1; there the bounds are
deterministic worst cases (all A corrupt clients are neighbours, exactly D clients drop), so
"δ" is read as a hard cap on dropouts rather than a rate. The dropout model is independent of
which clients are corrupt, and the graph seed must be unpredictable to the corrupt clients when
it is fixed (the server draws it from the OS CSPRNG); a malicious server that grinds graph seeds
is outside this model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import Enum

SECURITY_BITS = 40
CORRECTNESS_BITS = 20
COMPLETE_GRAPH_MAX_N = 32
# Keeps floating-point products like 0.05 * 1000 from rounding down one client.
_EPS = 1e-12


class ThreatMode(str, Enum):
    """Who the protocol defends against."""

    SEMI_HONEST = "semi_honest"
    MALICIOUS = "malicious"


@dataclass(frozen=True)
class ThreatModel:
    """Tolerated corrupt fraction, expected dropout fraction and server behaviour."""

    adversarial_rate: float = 0.05
    dropout_rate: float = 0.10
    mode: ThreatMode = ThreatMode.SEMI_HONEST
    security_bits: int = SECURITY_BITS
    correctness_bits: int = CORRECTNESS_BITS

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ThreatMode(self.mode))
        if not 0.0 <= self.adversarial_rate < 1.0:
            raise ValueError(f"adversarial_rate must be in [0, 1), got {self.adversarial_rate}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if self.security_bits < 1 or self.correctness_bits < 1:
            raise ValueError("security_bits and correctness_bits must be positive")
        gamma, delta = self.adversarial_rate, self.dropout_rate
        if self.mode is ThreatMode.SEMI_HONEST and gamma + delta > 0.9 + _EPS:
            raise ValueError(
                "infeasible threat model: semi-honest secure aggregation needs "
                f"adversarial_rate + dropout_rate <= 0.9, got {gamma} + {delta}"
            )
        if self.mode is ThreatMode.MALICIOUS and gamma + 2 * delta > 0.9 + _EPS:
            raise ValueError(
                "infeasible threat model: malicious-server secure aggregation needs "
                f"adversarial_rate + 2 * dropout_rate <= 0.9, got {gamma} + 2 * {delta}"
            )


@dataclass(frozen=True)
class GraphParameters:
    """Result of the finder: degree, threshold and the admissible threshold range."""

    n: int
    neighbors: int
    threshold: int
    min_threshold: int
    max_threshold: int

    @property
    def complete(self) -> bool:
        return self.neighbors == self.n - 1


def _counts(n: int, threat: ThreatModel) -> tuple[int, int, int]:
    corrupt = math.floor(threat.adversarial_rate * n + _EPS)
    dropped = math.floor(threat.dropout_rate * n + _EPS)
    surviving = math.ceil((1.0 - threat.dropout_rate) * n - _EPS)
    return corrupt, dropped, surviving


def _may_disconnect(n: int, k: int, bad: int, bits: int) -> bool:
    """Union bound of condition 1 (see module docstring), compared exactly in integers."""
    if k > bad:
        return False
    pairs_times_two = n * (n - k - 1)
    return pairs_times_two * math.perm(bad, k) * 2 ** (bits + 1) >= 2 * math.perm(n, k)


def _hypergeom_weights(n: int, marked: int, k: int) -> list[int]:
    """comb(marked, x) * comb(n - marked, k - x) for x = 0..k; divide by comb(n, k) for P[X=x]."""
    return [math.comb(marked, x) * math.comb(n - marked, k - x) for x in range(k + 1)]


def _upper_quantile(weights: list[int], total: int, scale: int) -> int:
    """Smallest x with P[X > x] * scale <= 1, where P[X = i] = weights[i] / total."""
    tail = 0
    for x in range(len(weights) - 1, -1, -1):
        tail += weights[x]
        if tail * scale > total:
            return x
    return -1


def _lower_limit(weights: list[int], total: int, scale: int) -> int:
    """Largest t with P[X < t] * scale <= 1."""
    cdf = 0
    for x, weight in enumerate(weights):
        cdf += weight
        if cdf * scale > total:
            return x
    return len(weights)


def _threshold_for(mode: ThreatMode, k: int, t1: int) -> int:
    if mode is ThreatMode.MALICIOUS:
        return (k + 1 + t1) // 2 + 1
    return max(t1 + 1, 2)


def _harary_range(n: int, k: int, threat: ThreatModel) -> tuple[int, int] | None:
    """(min_threshold, max_threshold) for a random Harary graph of degree k, or None."""
    corrupt, dropped, surviving = _counts(n, threat)
    if _may_disconnect(n, k, corrupt + dropped, threat.security_bits):
        return None
    total = math.comb(n, k)
    t1 = _upper_quantile(
        _hypergeom_weights(n, corrupt, k), total, n * 2 ** (threat.security_bits + 1)
    )
    t_max = _lower_limit(_hypergeom_weights(n, surviving, k), total, n * 2**threat.correctness_bits)
    t_min = _threshold_for(threat.mode, k, t1)
    return (t_min, min(t_max, k)) if t_min <= min(t_max, k) else None


def _complete_range(n: int, threat: ThreatModel) -> tuple[int, int] | None:
    """Deterministic worst case for the complete graph (k = n - 1, n holders per secret)."""
    corrupt, _, surviving = _counts(n, threat)
    k = n - 1
    t_min = _threshold_for(threat.mode, k, min(corrupt, k))
    # A dropped client's key is held by the surviving others only.
    t_max = min(surviving, k)
    return (t_min, t_max) if t_min <= t_max else None


def _range_for(n: int, k: int, threat: ThreatModel) -> tuple[int, int] | None:
    return _complete_range(n, threat) if k == n - 1 else _harary_range(n, k, threat)


def validate_degree(n: int, k: int) -> None:
    """Structural check: k = n - 1 (complete) or an even Harary degree 2 <= k <= n - 2."""
    if n < 3:
        raise ValueError(f"secure aggregation needs at least 3 clients, got n={n}")
    if k == n - 1:
        return
    if k < 2 or k > n - 2 or k % 2:
        raise ValueError(
            f"neighbors must be n-1={n - 1} (complete graph) or an even number in "
            f"[2, {n - 2}] (Harary graph), got {k}"
        )


@functools.lru_cache(maxsize=256)
def min_safe_threshold(n: int, k: int, threat: ThreatModel) -> int | None:
    """The lowest Shamir threshold that keeps a session of `n` clients and degree `k` secure
    under `threat` (bounds 1 and 2 of the module doc; None: no threshold does, the graph
    itself may disconnect the honest survivors). Correctness (bound 3) is left out: a
    threshold too high for the dropouts aborts rounds, it reveals nothing. A client checks
    the session a server sends against this, with its own threat model (its run config)."""
    validate_degree(n, k)
    corrupt, dropped, _ = _counts(n, threat)
    if k == n - 1:
        return _threshold_for(threat.mode, k, min(corrupt, k))
    if _may_disconnect(n, k, corrupt + dropped, threat.security_bits):
        return None
    t1 = _upper_quantile(
        _hypergeom_weights(n, corrupt, k), math.comb(n, k), n * 2 ** (threat.security_bits + 1)
    )
    return _threshold_for(threat.mode, k, t1)


def find_parameters(
    n: int,
    threat: ThreatModel | None = None,
    *,
    neighbors: int | None = None,
    threshold: int | None = None,
    complete_graph_max_n: int = COMPLETE_GRAPH_MAX_N,
) -> GraphParameters:
    """Smallest safe degree and threshold for `n` clients; validates user overrides.

    Raises `ValueError` when the threat model is infeasible or an override violates it.
    """
    threat = threat or ThreatModel()
    if neighbors is not None:
        validate_degree(n, neighbors)
        candidates = [neighbors]
    else:
        validate_degree(n, n - 1)
        harary = [] if n <= complete_graph_max_n else list(range(2, n - 1, 2))
        candidates = [*harary, n - 1]
    rejected: list[str] = []
    for k in candidates:
        admissible = _range_for(n, k, threat)
        if admissible is None:
            continue
        t_min, t_max = admissible
        if threshold is None:
            return GraphParameters(n, k, t_min, t_min, t_max)
        if t_min <= threshold <= t_max:
            return GraphParameters(n, k, threshold, t_min, t_max)
        rejected.append(f"k={k} admits t in [{t_min}, {t_max}]")
    if rejected:
        raise ValueError(
            f"threshold={threshold} is not admissible for n={n} under {threat}: "
            + "; ".join(rejected[:3])
            + f" (a lower t is insecure, a higher t fails with probability > "
            f"2^-{threat.correctness_bits})"
        )
    what = f"neighbors={neighbors}" if neighbors is not None else "any degree"
    raise ValueError(
        f"no secure and reliable threshold exists for n={n} with {what} under {threat}; "
        "increase the degree or the cohort, or lower the adversarial/dropout rates"
    )
