"""The Scheduler interface: what differs between sync rounds, FedBuff and SSP.

The engine (rounds.RoundEngine) runs one pipeline per server update:

    gather (the scheduler) -> release (the release mechanism) -> apply (server
    optimizer) -> evaluate -> after_apply (the scheduler) -> report -> persist

A scheduler decides who trains on which model version and when enough has come back
for one server update; it hands the engine one sum (`Gathered.got.agg`) to release.
It keeps its own order of summation: the barrier's sum is the update channel's over
one cohort; the buffer's is the staleness-weighted group sums in arrival order.

    barrier_scheduler.BarrierScheduler    server.mode = sync: one cohort per round,
                                          and the round waits for all of it
    buffered_scheduler.BufferedScheduler  server.mode = async (FedBuff: a server update
                                          after every K client updates) and ssp (the
                                          same, dispatching only within a staleness
                                          bound of the oldest download in flight)
    device_scheduler.DeviceScheduler      the buffer on the wall clock (devices)

A new mode is one more implementation of this Protocol, passed to RoundEngine as
`scheduler=`; the engine's steps, the release mechanisms and the clock stay as they
are. A scheduler reads and writes the engine only through `EngineView`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.aggregation import UpdateChannel
from fedveil.server.engine.ledger_opening import DpSgdLedger
from fedveil.server.engine.release_mechanism import ReleaseMechanism
from fedveil.server.engine.requests import ClientPrivacy
from fedveil.server.engine.round_record import RoundRecord
from fedveil.server.engine.round_steps import Collected
from fedveil.server.engine.sampling import CohortDraws
from fedveil.server.engine.transport import Transport
from fedveil.tasks import Task


@dataclass
class Gathered:
    """What one server update starts from: its record (counts filled in), the sum to
    release (`got.agg`; an abort or nothing), when gathering began, and `annex`: the
    operator-only fields persisted with the record (None: the record is public whole)."""

    record: RoundRecord
    got: Collected
    started: float = field(default_factory=time.perf_counter)
    annex: dict[str, Any] | None = None


class EngineView(Protocol):
    """What a scheduler may read and write of the engine it is attached to."""

    cfg: RunConfig
    task: Task
    transport: Transport
    channel: UpdateChannel
    model: FlatModel
    weights: torch.Tensor
    round: int
    privacy: ReleaseMechanism | None
    ledger_only: DpSgdLedger | None
    sampler: CohortDraws
    history: list[RoundRecord]
    annotators: list[Callable[[RoundRecord], None]]
    stopped_reason: str | None
    # The reason the public ledger's final record states (None: stopped_reason).
    public_stop_reason: str | None
    first_client_error: str | None

    def client_privacy(self) -> ClientPrivacy | None: ...

    def train_request(self, round_num: int) -> Envelope: ...

    def run_round(self) -> RoundRecord | None: ...


class Scheduler(Protocol):
    """Who trains when, and when a server update is due (see the module docstring)."""

    mode: str  # server.mode it implements ("sync", "async", "ssp")
    # Without DP, the fewest contributors whose mean is applied (fewer: nothing is).
    min_contributors: int

    def attach(self, engine: EngineView) -> None:
        """Bind to the engine, once, when the engine is built."""
        ...

    def admits_next(self) -> bool:
        """Whether another server update may be gathered (False: the run stops, its
        reason in engine.stopped_reason). Checked before each one."""
        ...

    def gather(self, round_num: int) -> Gathered | None:
        """Everything server update `round_num` releases; None: nothing more can come
        (the reason in engine.stopped_reason)."""
        ...

    def after_apply(self, record: RoundRecord) -> None:
        """The model moved to version `record.round`: dispatch with it, note the facts
        the record shows (before it is reported and persisted)."""
        ...

    def begin(self) -> None:
        """The run starts (after any restore)."""
        ...

    def end(self, failed: bool) -> None:
        """The run ended (its summary taken), or failed: let work in flight end."""
        ...

    def state(self) -> dict[str, Any]:
        """The scheduler's part of the checkpoint (top-level keys)."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint (before the engine restores its part)."""
        ...

    def summary(self) -> dict[str, Any]:
        """The scheduler's keys of the run summary."""
        ...
