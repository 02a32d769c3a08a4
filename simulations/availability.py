"""Simulated client availability: dropouts at each protocol stage, stragglers past the deadline.

Every client has a persistent dropout propensity and a persistent slowness, and
each (round, stage) adds its own draw. Draws are a function of (seed, client,
round, stage) only, so the same clients fail whichever worker, order or cohort
is involved, and a re-run of the same config fails the same clients.

- Dropout: client c drops at a stage with probability
  p_c = sigmoid(logit(p_stage) + spread * z_c), z_c ~ N(0, 1) fixed per client.
- Latency: L = latency_median * exp(client_sigma * s_c + sigma * e), s_c fixed per
  client, e fresh per (round, stage). A client whose L exceeds the exchange's
  deadline (server.round_timeout) is a straggler: its reply is lost. An exchange that
  computes nothing on the client's data (secure aggregation's key and unmasking
  stages) has the median latency_median * message_latency_share: a message's round
  trip, not a training's.
- Absent clients (simulation.absent_clients): named clients drop at the first stage
  they are asked, every round; a deployed round's dropouts replayed, so the simulation
  aggregates the cohort that round did (benchmarks/fleet_secagg_round.py).

A dropped or late client stays gone for the rest of its round, as a real one
whose connection broke would; the transport answers for it with a ClientFailure.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedveil.config import parse_client_ids, parse_stage_dropout
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import MESSAGE_KINDS
from fedveil.server.engine.transport import (
    CentralEvaluator,
    ClientFailure,
    ReplySink,
    RoundReporter,
    Transport,
)

if TYPE_CHECKING:
    import torch

    from fedveil.config import RunConfig

# Tags that separate the independent random streams (any distinct constants).
_PROPENSITY, _SLOWNESS, _DROP, _LATENCY = 0xD7, 0x51, 0xD2, 0x1A

DROPPED = "simulated dropout"
LATE = "simulated straggler"


def _uniforms(key: Sequence[int], cids: Sequence[int], count: int) -> np.ndarray:
    """`count` uniforms in (0, 1) per client, from numpy's SeedSequence hash of (key, cid)."""
    out = np.empty((len(cids), count))
    for i, cid in enumerate(cids):
        words = np.random.SeedSequence([*key, int(cid)]).generate_state(count, np.uint64)
        out[i] = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    return out


def _normals(key: Sequence[int], cids: Sequence[int]) -> np.ndarray:
    """One standard normal per client (Box-Muller on two uniforms)."""
    u = _uniforms(key, cids, 2)
    return np.sqrt(-2.0 * np.log(u[:, 0])) * np.cos(2.0 * math.pi * u[:, 1])


def _stage_id(stage: str) -> int:
    return zlib.crc32(stage.encode())


@dataclass(frozen=True)
class Verdict:
    """What the availability model decided for one exchange."""

    failed: dict[int, str]  # client -> reason (dropout or straggler)
    latency: dict[int, float] = field(default_factory=dict)  # simulated reply time, survivors

    def simulated_time(self, timeout_s: float | None) -> float:
        """How long the server waits: the deadline if anyone is missing, else the slowest reply."""
        if self.failed and timeout_s:
            return float(timeout_s)
        return max(self.latency.values(), default=0.0)


@dataclass(frozen=True)
class AvailabilityModel:
    seed: int
    dropout: float = 0.0
    spread: float = 0.0
    stage_dropout: Mapping[str, float] = field(default_factory=dict)
    latency_median: float = 0.0
    latency_sigma: float = 0.5
    latency_client_sigma: float = 0.5
    message_latency_share: float = 1.0  # median of a message-only exchange / latency_median
    absent: frozenset[int] = frozenset()  # never answer (simulation.absent_clients)

    def __post_init__(self) -> None:
        for name, p in [("dropout", self.dropout), *self.stage_dropout.items()]:
            if not 0.0 <= p < 1.0:
                raise ValueError(f"dropout probability for {name!r} = {p}: must be in [0, 1)")
        if self.latency_median < 0 or self.latency_sigma < 0 or self.latency_client_sigma < 0:
            raise ValueError("latency_median, latency_sigma, latency_client_sigma must be >= 0")
        if not 0.0 <= self.message_latency_share <= 1.0:
            raise ValueError(
                f"message_latency_share = {self.message_latency_share}: must be in [0, 1]"
            )

    @classmethod
    def from_config(cls, cfg: RunConfig) -> AvailabilityModel | None:
        """The model a config asks for, or None when every client is always available."""
        s = cfg.simulation
        model = cls(
            seed=cfg.seed,
            dropout=s.dropout,
            spread=s.dropout_spread,
            stage_dropout=parse_stage_dropout(s.dropout_stages),
            latency_median=s.latency_median,
            latency_sigma=s.latency_sigma,
            latency_client_sigma=s.latency_client_sigma,
            message_latency_share=s.message_latency_share,
            absent=parse_client_ids(s.absent_clients),
        )
        return model if model.active else None

    @property
    def active(self) -> bool:
        return (
            self.dropout > 0
            or any(self.stage_dropout.values())
            or self.latency_median > 0
            or bool(self.absent)
        )

    def dropout_probability(self, stage: str, cids: Sequence[int]) -> np.ndarray:
        """Each client's chance of dropping at `stage`."""
        p = self.stage_dropout.get(stage, self.dropout)
        if p <= 0:
            return np.zeros(len(cids))
        logit = np.full(len(cids), math.log(p / (1.0 - p)))
        if self.spread > 0:
            logit += self.spread * _normals((self.seed, _PROPENSITY), cids)
        return 1.0 / (1.0 + np.exp(-logit))

    def latency(self, round_num: int, stage: str, cids: Sequence[int]) -> np.ndarray:
        """Simulated reply latency in seconds (zeros when there is no latency model). An
        exchange that computes nothing on the client's data (MESSAGE_KINDS: secure
        aggregation's key and unmasking stages) has its median scaled by
        message_latency_share; the client's slowness and the draw's spread stay."""
        median = self.latency_median
        if stage in MESSAGE_KINDS:
            median *= self.message_latency_share
        if median <= 0:
            return np.zeros(len(cids))
        log_l = math.log(median) + np.zeros(len(cids))
        if self.latency_client_sigma > 0:
            log_l += self.latency_client_sigma * _normals((self.seed, _SLOWNESS), cids)
        if self.latency_sigma > 0:
            key = (self.seed, _LATENCY, round_num, _stage_id(stage))
            log_l += self.latency_sigma * _normals(key, cids)
        return np.exp(log_l)

    def judge(
        self, round_num: int, stage: str, cids: Sequence[int], timeout_s: float | None
    ) -> Verdict:
        """Which of `cids` drop or miss the deadline at this (round, stage)."""
        cids = sorted(int(c) for c in cids)
        if not cids:
            return Verdict({})
        p = self.dropout_probability(stage, cids)
        u = _uniforms((self.seed, _DROP, round_num, _stage_id(stage)), cids, 1)[:, 0]
        lat = self.latency(round_num, stage, cids)
        failed: dict[int, str] = {}
        latency: dict[int, float] = {}
        for cid, pc, uc, lc in zip(cids, p, u, lat, strict=True):
            if cid in self.absent:
                failed[cid] = f"{DROPPED} at stage {stage!r} (absent client)"
            elif uc < pc:
                failed[cid] = f"{DROPPED} at stage {stage!r} (p={pc:.3f})"
            elif timeout_s and lc > timeout_s:
                failed[cid] = f"{LATE}: reply after {lc:.2f} s, deadline {timeout_s:g} s"
            else:
                latency[cid] = float(lc)
        return Verdict(failed, latency)


class AvailabilityTransport:
    """Wraps any transport: clients the model fails never reach it and come back as failures.

    Decisions depend only on (seed, client, round, stage), so the in-process
    engine and Flower's simulation drop the same clients and reach the same model.
    """

    def __init__(self, inner: Transport, model: AvailabilityModel) -> None:
        self.inner, self.model = inner, model
        # Per round, since one exchange can carry two (secure aggregation sends the next
        # round's key stages with this round's messages): clients lost earlier in the
        # round, counts, simulated time. A message is judged at its own (primary) round
        # and stage; a rider (fedveil.protocol.piggyback) shares its message's fate.
        self._latest: int | None = None
        self._gone: dict[int, dict[int, str]] = {}
        self._counts: dict[int, dict[str, int]] = {}
        self._time: dict[int, float] = {}

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        out: dict[int, Envelope | ClientFailure] = {}
        by_stage: dict[tuple[int, str], list[int]] = {}
        for cid, msg in requests.items():
            self._see(msg.round)
            gone = self._gone[msg.round]
            if cid in gone:
                out[cid] = ClientFailure(cid, f"gone since an earlier stage: {gone[cid]}")
            else:
                by_stage.setdefault((msg.round, msg.kind), []).append(cid)
        wait = 0.0
        for (round_num, stage), cids in by_stage.items():
            verdict = self.model.judge(round_num, stage, cids, timeout_s)
            for cid, reason in verdict.failed.items():
                self._gone[round_num][cid] = reason
                late = reason.startswith(LATE)
                self._counts[round_num]["stragglers" if late else "dropouts"] += 1
                out[cid] = ClientFailure(cid, reason)
            wait = max(wait, verdict.simulated_time(timeout_s))
        if requests:
            # The exchange's time belongs to the round of its primary messages.
            first = min(msg.round for msg in requests.values())
            self._time[first] += wait
        live = {cid: msg for cid, msg in requests.items() if cid not in out}
        if live:
            out.update(self.inner.exchange(live, timeout_s, on_reply=on_reply))
        return out

    def evaluate_central(
        self, weights: torch.Tensor, round_num: int, batch_size: int
    ) -> tuple[float, float, int] | None:
        """The server's own evaluation is no client's: the availability model does not apply."""
        if isinstance(self.inner, CentralEvaluator):
            return self.inner.evaluate_central(weights, round_num, batch_size)
        return None

    def _see(self, round_num: int) -> None:
        latest = self._latest
        if latest is not None and round_num < latest - 1:  # a new run
            self._gone, self._counts, self._time = {}, {}, {}
            latest = None
        if latest is None or round_num > latest:
            self._latest = round_num
            for table in (self._gone, self._counts, self._time):
                for old in [r for r in table if r < round_num - 1]:
                    del table[old]
        if round_num not in self._gone:
            self._gone[round_num] = {}
            self._counts[round_num] = {"dropouts": 0, "stragglers": 0}
            self._time[round_num] = 0.0

    def round_report(self, round_num: int) -> dict[str, Any]:
        """Simulated dropouts, stragglers and (with a latency model) simulated time."""
        report: dict[str, Any] = {}
        if isinstance(self.inner, RoundReporter):
            report.update(self.inner.round_report(round_num))
        if round_num in self._counts:
            report["sim_dropouts"] = self._counts[round_num]["dropouts"]
            report["sim_stragglers"] = self._counts[round_num]["stragglers"]
            if self.model.latency_median > 0:
                report["sim_time_s"] = round(self._time[round_num], 6)
        return report

    def close(self) -> None:
        self.inner.close()
