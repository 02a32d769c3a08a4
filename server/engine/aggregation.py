"""Collecting the cohort's updates into one weighted sum.

An UpdateChannel runs whatever exchanges it needs over the transport and
returns only the sum: in the clear (PlainChannel) or through secure
aggregation, where the server never sees a single client's update. The round
engine averages whatever sum the channel hands back.

Under central DP the accountant assumes every update has L2 norm <= C and weight 1.
In the clear the server enforces both (PlainChannel). Under secure aggregation it
cannot: it only sees the sum, so the sensitivity C holds only for honest clients,
whose runtime clips and whose quantizer bounds the rounded update.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fedveil.privacy.dp.clipping import clip_l2, l2_norm
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import (
    CLIP_NORM,
    DELTA,
    LOSS,
    NUM_EXAMPLES,
    UNCLIPPED,
    WEIGHT,
)
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.evaluation_answer import MAX_EXAMPLES, check_evaluation_answer
from fedveil.server.engine.robust import RobustAggregator
from fedveil.server.engine.transport import ClientFailure, Transport
from fedveil.server.engine.unmask_gate import Aborted

log = logging.getLogger("fedveil.aggregation")

# The largest float32: a round's sum of n weighted updates stays finite when each
# weighted value is at most this / n.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


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


@dataclass(frozen=True)
class NoUpdates:
    """No update arrived to aggregate: every sampled client dropped, and why each did
    (so a round in which all clients failed still says why)."""

    dropped: dict[int, str] = field(default_factory=dict)


class UpdateChannel(Protocol):
    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
    ) -> Aggregate | Aborted | NoUpdates | None:
        """Run the round's exchanges: the sum, an abort (secure aggregation), or no
        update at all (NoUpdates with the reasons; None from a channel that has none).
        `upcoming` is the next round's cohort when known (a channel may prepare it)."""
        ...


# Per-client counters a train reply may carry, each summed over the cohort.
COUNTERS = (UNCLIPPED,)
# Aggregate.extras key: updates the server re-clipped to C or re-weighted to 1 (central DP).
RECLIPPED = "server_reclipped"


@dataclass
class TrainReply:
    delta: torch.Tensor
    weight: float
    loss: float
    counters: dict[str, float]


def check_train_reply(reply: Envelope, round_num: int, model_size: int) -> TrainReply:
    """The checked contents of a train reply, or MessageError naming the check."""
    if reply.kind != Kind.TRAIN:
        raise MessageError(f"expected a train reply, got {reply.kind!r}")
    if reply.round != round_num:
        raise MessageError(f"reply is for round {reply.round}, this is round {round_num}")
    n = reply.get(NUM_EXAMPLES, int)
    if not 0 < n <= MAX_EXAMPLES:
        raise MessageError(f"num_examples = {n}: must be in [1, {MAX_EXAMPLES}]")
    loss = float(reply.get(LOSS, (int, float)))
    if not math.isfinite(loss):
        raise MessageError(f"loss = {loss}: must be finite")
    weight = float(reply.get(WEIGHT, (int, float))) if WEIGHT in reply.config else float(n)
    if not 0 < weight <= MAX_EXAMPLES:
        raise MessageError(f"weight = {weight}: must be in (0, {MAX_EXAMPLES}]")
    counters: dict[str, float] = {}
    for key in COUNTERS:
        if key in reply.config:
            value = float(reply.get(key, (int, float)))
            if value not in (0.0, 1.0):
                raise MessageError(f"{key} = {value}: must be 0 or 1")
            counters[key] = value
    delta = reply.tensor(DELTA, numel=model_size)
    return TrainReply(delta, weight, loss, counters)


def check_evaluate_reply(reply: Envelope, round_num: int) -> tuple[int, float, float]:
    """(count, accuracy, loss) of a federated evaluation reply for `round_num`, or
    MessageError naming the check."""
    if reply.kind != Kind.EVALUATE:
        raise MessageError(f"expected an evaluate reply, got {reply.kind!r}")
    if reply.round != round_num:
        raise MessageError(f"reply is for round {reply.round}, this is round {round_num}")
    try:
        return check_evaluation_answer(reply.config)
    except ValueError as exc:
        raise MessageError(str(exc)) from None


def request_clip_norm(request: Envelope) -> float | None:
    """The clip norm C a training request asks for (central DP), or None without one."""
    clip = float(request.config.get(CLIP_NORM, 0.0) or 0.0)
    return clip if clip > 0 else None


def enforce_clip(reply: TrainReply, clip_norm: float) -> tuple[TrainReply, bool]:
    """The reply with its update re-clipped to L2 norm <= `clip_norm` and weight 1, and
    whether anything had to change. An honest client's update (clipped, weight 1) comes
    back bit for bit."""
    changed = reply.weight != 1.0
    delta = reply.delta
    if l2_norm(delta) > clip_norm:
        clipped = torch.from_numpy(clip_l2(delta, clip_norm))
        delta, changed = clipped.to(reply.delta.device), True
    return TrainReply(delta, 1.0, reply.loss, reply.counters), changed


class PlainChannel:
    """Updates in the clear, summed in client-id order (deterministic float sums).

    Under central DP (the request carries `clip_norm`) the server does not trust the
    client's clip: it re-clips every update to that norm with `clip_l2` and sets its
    weight to 1, so one client moves the sum by at most C whatever it sends. The number
    of updates it had to change is `Aggregate.extras["server_reclipped"]`; it is logged
    at debug level only, without client ids. NaN or Inf updates are refused and the
    client dropped. With secure aggregation no such check is possible (the server sees
    only the sum): the sensitivity then holds only for honest clients.

    With a robust `aggregator` (`server.aggregator`, robust.py) the checked updates are
    held, n x d floats, and combined by that rule instead of summed (unweighted; the
    Aggregate is its own mean, weight 1); the round's bound check is its `round_report`.
    Without one (`mean`) the sum is the same, bit for bit, as before."""

    def __init__(
        self,
        on_drop: Callable[[int, str], None] | None = None,
        aggregator: RobustAggregator | None = None,
        summed_with: int = 1,
    ) -> None:
        """`summed_with`: how many of this channel's sums are added up again after it
        (asynchronous training's buffer of K): each reply's bound against overflow
        (`sum_overflow`) then divides by the cohort times that."""
        if summed_with < 1:
            raise ValueError(f"summed_with = {summed_with}: must be >= 1")
        self.on_drop = on_drop
        self.aggregator = aggregator
        self.summed_with = summed_with
        self._reports: dict[int, dict[str, Any]] = {}

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        """The robust aggregator's bound check for the round (empty for the mean)."""
        return self._reports.pop(round_num, {})

    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
        upcoming: list[int] | None = None,
    ) -> Aggregate | NoUpdates:
        round_num = next(iter(requests.values())).round
        acc = _WeightedSum() if self.aggregator is None else _HeldUpdates(self.aggregator)
        fold = _InOrder(requests, round_num, model_size, acc, self.summed_with)
        # Replies are checked and summed as they arrive, in client-id order (one that
        # comes early waits for those before it): the same sum, bit for bit, as after the
        # exchange, but most of it done while the remaining clients still train.
        rest = transport.exchange(requests, timeout_s, on_reply=fold.take)
        fold.finish(rest)
        dropped, clipped_by_server = fold.dropped, fold.clipped_by_server
        if clipped_by_server is not None:
            acc.extras[RECLIPPED] = float(clipped_by_server)
            if clipped_by_server:
                log.debug(
                    "round %d: %d of %d updates re-clipped to the clip norm or re-weighted to 1",
                    round_num,
                    clipped_by_server,
                    len(acc.contributors),
                )
        if self.on_drop:
            for cid, reason in dropped.items():
                self.on_drop(cid, reason)
        if isinstance(acc, _HeldUpdates):
            result = acc.result(dropped, round_num)
            self._reports[round_num] = acc.report
            return result
        return acc.result(dropped)


class _InOrder:
    """Checks each train reply and adds it to `acc` in client-id order, as soon as every
    client before it has replied or failed (`take`, a transport's `on_reply`); `finish`
    folds what the exchange returned and fails the clients that never replied."""

    def __init__(
        self,
        requests: dict[int, Envelope],
        round_num: int,
        model_size: int,
        acc: _WeightedSum | _HeldUpdates,
        summed_with: int = 1,
    ) -> None:
        self.requests, self.round_num = requests, round_num
        self.summed_with = summed_with
        self.model_size, self.acc = model_size, acc
        self.order = sorted(requests)
        self.next = 0
        self.held: dict[int, Envelope | ClientFailure] = {}
        self.dropped: dict[int, str] = {}
        self.clipped_by_server: int | None = None  # None: no request under central DP

    def take(self, cid: int, reply: Envelope | ClientFailure) -> None:
        if cid not in self.requests:  # not asked this exchange: ignored, as before
            return
        self.held[cid] = reply
        while self.next < len(self.order) and self.order[self.next] in self.held:
            cid = self.order[self.next]
            self.next += 1
            self._fold(cid, self.held.pop(cid))

    def finish(self, rest: Mapping[int, Envelope | ClientFailure]) -> None:
        for cid in self.order[self.next :]:
            reply = self.held.pop(cid, None)
            if reply is None:
                reply = rest.get(cid, ClientFailure(cid, "no reply"))
            self._fold(cid, reply)
        self.next = len(self.order)

    def _fold(self, cid: int, reply: Envelope | ClientFailure) -> None:
        if isinstance(reply, ClientFailure):
            self.dropped[cid] = reply.reason
            return
        try:
            r = check_train_reply(reply, self.round_num, self.model_size)
        except MessageError as exc:
            self.dropped[cid] = str(exc)
            return
        clip = request_clip_norm(self.requests[cid])
        if clip is not None:
            r, changed = enforce_clip(r, clip)
            self.clipped_by_server = (self.clipped_by_server or 0) + int(changed)
        overflow = sum_overflow(r, len(self.order) * self.summed_with)
        if overflow is not None:
            self.dropped[cid] = overflow
            return
        self.acc.add(cid, r)


def sum_overflow(reply: TrainReply, terms: int) -> str | None:
    """Why `reply` could overflow the float32 sum it joins, of `terms` updates, or None.

    Each value is finite (Envelope.tensor), but a finite update times its weight, or the
    sum of a few such, can still reach infinity, and an infinite sum makes the model NaN
    for the rest of the run. Each weighted value must be at most FLOAT32_MAX / terms:
    then the sum is finite, whoever replies."""
    limit = FLOAT32_MAX / terms
    delta = reply.delta
    if not delta.numel():
        return None
    # max |value| <= the L2 norm: one dot product (half an aminmax's time) clears every
    # honest update, with 1% to spare for the float32 sum's rounding; only an update
    # near the bound (or whose squares overflow: the norm reads inf) is measured exactly.
    if 1.01 * reply.weight * math.sqrt(float(torch.dot(delta, delta))) <= limit:
        return None
    low, high = torch.aminmax(delta)  # one pass, no |delta| copy
    largest = max(-float(low), float(high))
    scaled = largest * reply.weight
    if not (scaled <= limit):
        return (
            f"delta: largest |value| {largest:.4g} x weight {reply.weight:g} = {scaled:.4g} "
            f"is over {limit:.4g} (float32's largest / {terms} updates summed): the sum "
            "would overflow"
        )
    return None


@dataclass
class _HeldUpdates:
    """The cohort's checked updates, held for a robust rule (client-id order)."""

    rule: RobustAggregator
    deltas: list[torch.Tensor] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    extras: dict[str, float] = field(default_factory=dict)
    contributors: list[int] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)

    def add(self, cid: int, r: TrainReply) -> None:
        self.deltas.append(r.delta)
        self.losses.append(r.loss)
        for key, value in r.counters.items():
            self.extras[key] = self.extras.get(key, 0.0) + value
        self.contributors.append(cid)

    def result(self, dropped: dict[int, str], round_num: int) -> Aggregate | NoUpdates:
        if not self.deltas:
            return NoUpdates(dropped)
        stacked = torch.stack([d.to(self.deltas[0].device) for d in self.deltas])
        self.deltas.clear()
        out = self.rule.aggregate(stacked, round_num)
        self.report = out.report
        # A reported loss is a client's claim too: its median, not its mean.
        loss = float(torch.tensor(self.losses, dtype=torch.float64).median())
        update = out.update.to(stacked.dtype)
        return Aggregate(update, 1.0, self.contributors, loss, dropped, self.extras)


@dataclass
class _WeightedSum:
    """The cohort's updates summed in the order they are added (client-id order: the
    float sums are then the same on every run)."""

    total: torch.Tensor | None = None
    weight: float = 0.0
    loss_sum: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)
    contributors: list[int] = field(default_factory=list)

    def add(self, cid: int, r: TrainReply) -> None:
        w = r.weight
        t = self.total
        self.total = r.delta * w if t is None else t.add_(r.delta.to(t.device), alpha=w)
        self.weight += w
        self.loss_sum += r.loss * w
        for key, value in r.counters.items():
            self.extras[key] = self.extras.get(key, 0.0) + value
        self.contributors.append(cid)

    def result(self, dropped: dict[int, str]) -> Aggregate | NoUpdates:
        if self.total is None:
            return NoUpdates(dropped)
        loss = self.loss_sum / self.weight
        return Aggregate(self.total, self.weight, self.contributors, loss, dropped, self.extras)
