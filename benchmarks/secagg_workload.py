"""The secure-aggregation compute benchmark's workload, shared by both sides.

`bench_secagg.py` (fedveil's protocol) and `flower_secaggplus_compute.py` (Flower's
SecAgg+ building blocks) import it: the same updates, weights, dropped clients, graph
parameters and quantisation (Flower's SecAggPlusWorkflow defaults), and the same clock.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from fedveil.privacy.secagg import DropoutPattern, Stage, ThreatModel, find_parameters
from fedveil.privacy.secagg.params import ThreatMode

# SecAggPlusWorkflow defaults, used on both sides.
CLIP_RANGE = 8.0
LEVELS = 2**22
MAX_WEIGHT = 1000
FLOWER_MOD_RANGE = 2**32
ADVERSARIAL_RATE = 0.05
# Compute is measured as process CPU time (all threads): robust on a shared, busy machine.
CLOCK = time.process_time


def graph_parameters(
    n: int,
    dropout: float,
    neighbors: int | None,
    threshold: int | None,
    threat: ThreatMode = ThreatMode.SEMI_HONEST,
) -> tuple[int, int]:
    """(k, t): given values, or the parameter finder's at 5 % adversarial clients."""
    if neighbors is not None and threshold is not None:
        return neighbors, threshold
    params = find_parameters(
        n,
        ThreatModel(ADVERSARIAL_RATE, dropout, threat),
        neighbors=neighbors,
        threshold=threshold,
    )
    return params.neighbors, params.threshold


def client_update(cid: int, dim: int, seed: int) -> tuple[np.ndarray, int]:
    """The float update and example count of one client (same on both sides)."""
    rng = np.random.default_rng([seed, cid])
    return rng.normal(0.0, 1.0, dim), int(rng.integers(1, MAX_WEIGHT + 1))


def dropped_clients(ids: list[int], dropout: float, seed: int) -> frozenset[int]:
    pattern = DropoutPattern.random(ids, dropout, seed, stages=(Stage.MASKED_INPUT,))
    return pattern.silent_at(Stage.MASKED_INPUT)


def _median(values: Any) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else 0.0


def _expected_mean(ids: set[int], dim: int, seed: int) -> np.ndarray:
    total, weights = np.zeros(dim), 0
    for cid in ids:
        x, w = client_update(cid, dim, seed)
        total += w * np.clip(x, -CLIP_RANGE, CLIP_RANGE)
        weights += w
    return total / weights
