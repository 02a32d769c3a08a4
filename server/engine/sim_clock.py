"""When asynchronous units arrive: a clock interface and its simulated implementation.

The engine asks the clock for the next arrival; it never looks at the wall clock, so
an in-process run and a Flower simulation of the same config and seed process the
same arrivals in the same order and reach the same model. Arrival time is dispatch
time plus the unit's latency from the availability model (or a fixed 1.0 s without
one); ties go to the earlier dispatch (its sequence number). A deployment's clock
(replies as they come) implements the same `ArrivalClock` interface.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

# Latency of a unit when the run has no latency model: order is still defined.
DEFAULT_LATENCY_S = 1.0
TRAIN_STAGE = "train"


class ArrivalClock(Protocol):
    """The order in which dispatched units come back."""

    def now(self) -> float: ...

    def schedule(self, seq: int, at: float) -> None:
        """Unit `seq` comes back at time `at`."""
        ...

    def next_arrival(self) -> tuple[float, int] | None:
        """(time, seq) of the next arrival, advancing the clock to it; None: none pending."""
        ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


class SimulatedClock:
    """Arrivals in simulated-time order (ties: dispatch sequence), never wall-clock order."""

    def __init__(self) -> None:
        self._now = 0.0
        self._heap: list[tuple[float, int]] = []

    def now(self) -> float:
        return self._now

    def schedule(self, seq: int, at: float) -> None:
        heapq.heappush(self._heap, (float(at), int(seq)))

    def next_arrival(self) -> tuple[float, int] | None:
        if not self._heap:
            return None
        at, seq = heapq.heappop(self._heap)
        self._now = max(self._now, at)
        return at, seq

    def peek(self) -> float | None:
        """When the next arrival comes, without taking it."""
        return self._heap[0][0] if self._heap else None

    def advance(self, at: float) -> None:
        """Move the clock to `at` (an event other than an arrival: a member freed)."""
        self._now = max(self._now, float(at))

    def state(self) -> dict[str, Any]:
        # The pending arrivals are rebuilt from the units in flight on restore.
        return {"now": self._now}

    def restore(self, state: dict[str, Any]) -> None:
        self._now = float(state["now"])
        self._heap = []


class Verdict(Protocol):
    failed: dict[int, str]
    latency: dict[int, float]

    def simulated_time(self, timeout_s: float | None) -> float: ...


class Availability(Protocol):
    """Simulated availability (fedveil.simulations.availability.AvailabilityModel): which
    clients drop at a (round, stage), and how long the others take."""

    latency_median: float

    def judge(
        self, round_num: int, stage: str, cids: Sequence[int], timeout_s: float | None
    ) -> Verdict: ...

    def latency(self, round_num: int, stage: str, cids: Sequence[int]) -> np.ndarray: ...


def plain_unit_fate(
    availability: Availability | None, seq: int, clients: Sequence[int], timeout_s: float | None
) -> tuple[float, dict[int, str]]:
    """(latency, failed clients) of a unit trained in the clear, dispatched as `seq`.

    The unit comes back when its slowest member has; a member that drops is noticed when
    its reply would have come (or at the deadline, when there is one)."""
    if availability is None:
        return DEFAULT_LATENCY_S, {}
    verdict = availability.judge(seq, TRAIN_STAGE, list(clients), timeout_s)
    if availability.latency_median <= 0:
        return DEFAULT_LATENCY_S, dict(verdict.failed)
    lat = availability.latency(seq, TRAIN_STAGE, sorted(clients))
    slowest = float(np.max(lat)) if len(lat) else 0.0
    if verdict.failed and timeout_s:  # the server waits for the deadline
        slowest = float(timeout_s)
    return slowest, dict(verdict.failed)
