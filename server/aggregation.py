"""Collecting the cohort's updates into one weighted sum.

An UpdateChannel runs whatever exchanges it needs over the transport and
returns only the sum: in the clear (PlainChannel) or through secure
aggregation, where the server never sees a single client's update. The round
engine averages whatever sum the channel hands back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from fedveil.envelope import Envelope, MessageError

from .transport import ClientFailure, Transport

# A client may not claim more examples than this: its weight in the average.
MAX_EXAMPLES = 10_000_000


@dataclass
class Aggregate:
    total: torch.Tensor  # sum over contributors of weight_k * delta_k
    weight: float  # sum of weight_k
    contributors: list[int]
    loss: float  # weighted mean training loss
    dropped: dict[int, str] = field(default_factory=dict)
    # Sums of small per-client counters (e.g. "unclipped" for adaptive clipping).
    extras: dict[str, float] = field(default_factory=dict)

    @property
    def mean(self) -> torch.Tensor:
        return self.total / self.weight


class UpdateChannel(Protocol):
    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
    ) -> Aggregate | None:
        """Run the round's exchanges; None when too few updates arrived to aggregate.
        `upcoming` is the next round's cohort when known (a channel may prepare it)."""
        ...


# Per-client counters a train reply may carry, each summed over the cohort.
COUNTERS = ("unclipped",)


@dataclass
class TrainReply:
    delta: torch.Tensor
    weight: float
    loss: float
    counters: dict[str, float]


def check_train_reply(reply: Envelope, round_num: int, model_size: int) -> TrainReply:
    """The checked contents of a train reply, or MessageError naming the check."""
    if reply.kind != "train":
        raise MessageError(f"expected a train reply, got {reply.kind!r}")
    if reply.round != round_num:
        raise MessageError(f"reply is for round {reply.round}, this is round {round_num}")
    n = reply.get("num_examples", int)
    if not 0 < n <= MAX_EXAMPLES:
        raise MessageError(f"num_examples = {n}: must be in [1, {MAX_EXAMPLES}]")
    loss = float(reply.get("loss", (int, float)))
    if not math.isfinite(loss):
        raise MessageError(f"loss = {loss}: must be finite")
    weight = float(reply.get("weight", (int, float))) if "weight" in reply.config else float(n)
    if not 0 < weight <= MAX_EXAMPLES:
        raise MessageError(f"weight = {weight}: must be in (0, {MAX_EXAMPLES}]")
    counters: dict[str, float] = {}
    for key in COUNTERS:
        if key in reply.config:
            value = float(reply.get(key, (int, float)))
            if value not in (0.0, 1.0):
                raise MessageError(f"{key} = {value}: must be 0 or 1")
            counters[key] = value
    delta = reply.tensor("delta", numel=model_size)
    return TrainReply(delta, weight, loss, counters)


class PlainChannel:
    """Updates in the clear, summed in client-id order (deterministic float sums)."""

    def __init__(self, on_drop: Callable[[int, str], None] | None = None) -> None:
        self.on_drop = on_drop

    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
    ) -> Aggregate | None:
        round_num = next(iter(requests.values())).round
        replies = transport.exchange(requests, timeout_s)
        total: torch.Tensor | None = None
        weight = 0.0
        loss_sum = 0.0
        extras: dict[str, float] = {}
        contributors: list[int] = []
        dropped: dict[int, str] = {}
        for cid in sorted(requests):
            reply = replies.get(cid, ClientFailure(cid, "no reply"))
            if isinstance(reply, ClientFailure):
                dropped[cid] = reply.reason
                continue
            try:
                r = check_train_reply(reply, round_num, model_size)
            except MessageError as exc:
                dropped[cid] = str(exc)
                continue
            w = r.weight
            total = r.delta * w if total is None else total.add_(r.delta.to(total.device), alpha=w)
            weight += w
            loss_sum += r.loss * w
            for key, value in r.counters.items():
                extras[key] = extras.get(key, 0.0) + value
            contributors.append(cid)
        if self.on_drop:
            for cid, reason in dropped.items():
                self.on_drop(cid, reason)
        if total is None:
            return None
        return Aggregate(total, weight, contributors, loss_sum / weight, dropped, extras)
