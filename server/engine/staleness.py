"""Staleness of an asynchronous update, and the weight it gets (FedBuff).

An update's staleness tau is the number of server updates (model versions) applied
between its client's download and its arrival. It weighs s(tau) = (1 + tau)^-a:
a = 0.5 is FedBuff's 1/sqrt(1 + tau), a = 0 weighs every update alike.
"""

from __future__ import annotations


def staleness_weight(tau: int, exponent: float) -> float:
    """s(tau) = (1 + tau)^-exponent (1.0 for a fresh update)."""
    if tau < 0:
        raise ValueError(f"staleness = {tau}: must be >= 0")
    return float((1.0 + tau) ** -exponent)


def too_stale(tau: int, max_staleness: int) -> bool:
    """Whether an update `tau` versions old is dropped (max_staleness 0: no limit)."""
    return max_staleness > 0 and tau > max_staleness


def ssp_allows(version: int, oldest_in_flight: int | None, bound: int) -> bool:
    """Stale-synchronous gate: a unit may be dispatched at model `version` only while it is
    at most `bound` versions ahead of the oldest download still in flight (None: none)."""
    return oldest_in_flight is None or version - oldest_in_flight <= bound
