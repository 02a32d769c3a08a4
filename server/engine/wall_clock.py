"""The wall clock of asynchronous training on devices: units come back when they do.

`WallClock` implements sim_clock.ArrivalClock for deployments. Where the simulated clock
orders arrivals by the availability model's latencies, `schedule(seq, _)` starts the
unit's exchange on a thread of its own, and `next_arrival` hands back units in the order
their exchanges finish. The engine still does everything else on its one thread (buffer,
apply, dispatch, checkpoint); a worker thread only runs its unit's exchange and fills in
the unit's outcome before it reports the unit done.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fedveil.server")

# What `WallClock.schedule` runs for a unit: built on the engine's thread (the unit's
# requests, from the weights it downloads), then run on the unit's own thread.
Work = Callable[[], None]

POLL_S = 0.5  # how often a wait for arrivals wakes (a signal, a stop) when none comes


class WallClock:
    """Arrivals in wall-clock order: one thread per unit in flight.

    `starter(seq)` (the engine's, set with `bind`) returns the work of unit `seq`; a unit
    whose work raised still arrives (its work records why it failed). A sequence number
    reported twice is handed back twice: the engine drops and counts the second."""

    def __init__(self) -> None:
        self._origin = time.monotonic()
        self._offset = 0.0  # seconds before this attempt (restored from a checkpoint)
        self._done: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._running: Counter[int] = Counter()  # seq -> threads not yet handed back
        self._threads: list[threading.Thread] = []
        self._starter: Callable[[int], Work] | None = None
        # Units scheduled before start() (restored from a checkpoint before the devices
        # have checked in again): started by start(), not at once.
        self._held: list[int] | None = []

    def bind(self, starter: Callable[[int], Work]) -> None:
        self._starter = starter

    def now(self) -> float:
        """Wall seconds since the run began (over every attempt of it)."""
        return self._offset + (time.monotonic() - self._origin)

    def start(self) -> None:
        """Begin running units: those scheduled so far start now, later ones at once."""
        held, self._held = self._held or [], None
        for seq in held:
            self.schedule(seq, 0.0)

    def schedule(self, seq: int, at: float) -> None:
        """Start unit `seq` now (after start()); `at`, a simulated arrival time, has no
        meaning here."""
        if self._held is not None:
            self._held.append(seq)
            return
        if self._starter is None:
            raise RuntimeError("WallClock.schedule before bind(): no engine to start units")
        work = self._starter(seq)
        thread = threading.Thread(
            target=self._run, args=(seq, work), name=f"fedveil-unit-{seq}", daemon=True
        )
        self._running[seq] += 1
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _run(self, seq: int, work: Work) -> None:
        try:
            work()
        except Exception:  # the work records its own failure; never lose the arrival
            log.exception("dispatch %d: its exchange failed", seq)
        finally:
            self._done.put(seq)

    def in_flight(self) -> int:
        return sum(self._running.values())

    def next_arrival(self) -> tuple[float, int] | None:
        """(wall seconds, seq) of the next unit whose exchange ended, waiting for one;
        None when none is running."""
        while self.in_flight():
            try:
                seq = self._done.get(timeout=POLL_S)
            except queue.Empty:
                continue
            self._running[seq] -= 1
            if self._running[seq] <= 0:
                del self._running[seq]
            return self.now(), seq
        return None

    def join(self, timeout_s: float) -> bool:
        """Wait for every unit's thread to end (after the transport was closed); whether
        all did within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def state(self) -> dict[str, Any]:
        # Units in flight are the engine's to checkpoint; on resume it schedules them again.
        return {"now": self.now()}

    def restore(self, state: dict[str, Any]) -> None:
        self._offset = float(state["now"])
        self._origin = time.monotonic()
