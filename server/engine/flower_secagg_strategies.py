"""Which Flower Message-API strategies secure aggregation can serve, and why not others.

Secure aggregation releases only the (weighted) sum of the cohort's updates. A strategy
whose aggregate is a function of that sum works unchanged: FedAvg, FedProx, FedAvgM and
the FedOpt family (FedAdagrad, FedAdam, FedYogi). One that needs every client's update
(a median, a trimmed mean, a selection by distance) cannot, and is refused by name.
"""

from __future__ import annotations

from typing import Any

from flwr.serverapp.strategy import (
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
)

# Strategies whose aggregate_train averages the replies (then maybe steps an optimizer).
SUM_STRATEGIES: tuple[type, ...] = (FedAvg, FedProx, FedAvgM, FedAdagrad, FedAdam, FedYogi)

_NEEDS_EACH_UPDATE = {
    "Krum": "selects the update closest to its neighbours",
    "MultiKrum": "selects the updates closest to their neighbours",
    "Bulyan": "selects and trims updates by their distances",
    "FedMedian": "takes a coordinate-wise median",
    "FedTrimmedAvg": "trims each coordinate's extreme values",
    "QFedAvg": "reweights each client by its own loss",
    "FedXgbBagging": "merges each client's trees",
    "FedXgbCyclic": "takes one client's model per round",
}


class StrategyRefused(ValueError):
    """The strategy's aggregate is not a function of the sum of updates."""


def check_strategy(strategy: Any) -> None:
    """Refuse a strategy secure aggregation cannot serve, saying why."""
    cls = type(strategy)
    for base in cls.__mro__:
        why = _NEEDS_EACH_UPDATE.get(base.__name__)
        if why is not None and base.__module__.startswith("flwr."):
            raise StrategyRefused(
                f"strategy {cls.__name__}: it {why}, which needs every client's update; "
                "secure aggregation reveals only their sum. Allowed: "
                + ", ".join(s.__name__ for s in SUM_STRATEGIES)
            )
    aggregate = getattr(cls, "aggregate_train", None)
    if not isinstance(strategy, FedAvg) or aggregate not in {
        s.aggregate_train for s in SUM_STRATEGIES
    }:
        raise StrategyRefused(
            f"strategy {cls.__name__}: secure aggregation serves strategies whose "
            "aggregate_train averages the replies ("
            + ", ".join(s.__name__ for s in SUM_STRATEGIES)
            + "); this one has its own aggregate_train, which may need each client's update"
        )
