"""How large a secure-aggregation session's cohort can be, and how few survivors it may
unmask: the sizes the threat model's threshold (params.py), the feasibility check
(feasibility.py) and the distributed-DP plan (privacy/dp/plan.py) are computed for.
Pure functions of the run's plain parameters (fedveil.protocol.dp_parameters).
"""

from __future__ import annotations

import math

from fedveil.protocol.dp_parameters import DpParameters
from fedveil.protocol.dp_rules import FIXED


def max_cohort(p: DpParameters, num_clients: int) -> int:
    """Largest cohort a round can have (Poisson: mean + 5 sd, capped by the population);
    asynchronous: a secure-aggregation group of G, the cohort of one session."""
    if p.asynchronous:
        return p.group_size
    if p.sampling == FIXED:
        return p.per_round
    mean = p.poisson_rate * num_clients
    return min(num_clients, math.ceil(mean + 5 * math.sqrt(max(mean, 1.0))))


def survivor_floor(p: DpParameters, num_clients: int, threshold: int) -> int:
    """Fewest masked inputs a distributed-DP round may unmask: the Shamir `threshold`, or a
    small cohort (Poisson: mean - 2 sd) less the expected dropouts, capped by the cohort.
    Asynchronous: a group of G less its expected dropouts (G is fixed at dispatch), and
    at most R when the group releases at its first R (server.group_release_at)."""
    fixed = p.sampling == FIXED or p.asynchronous
    if p.asynchronous:
        expected: float = p.group_size
    else:
        expected = p.per_round if fixed else p.poisson_rate * num_clients
    low = expected if fixed else expected - 2 * math.sqrt(expected)
    survivors_low = math.floor(low * (1 - p.dropout_rate))
    if p.asynchronous and p.group_release_at:  # the sum covers the first R, no more
        survivors_low = min(survivors_low, p.group_release_at)
    return min(max(threshold, 2, survivors_low), max_cohort(p, num_clients))
