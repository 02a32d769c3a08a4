"""Asynchronous training on devices: the buffer of K on the wall clock (wall_clock.py).

Everything the engine decides is the same as in simulation: C clients in flight in
dispatch units, a replacement dispatched as soon as a unit comes back, an update after
every K client updates weighted by its staleness, ssp's gate, the checkpoint at each
apply. What differs is when units come back: each unit (one client in the clear, or one
secure-aggregation group run by the update channel as one session) runs its exchange
on a thread of its own as soon as it is dispatched, and arrives when that exchange
ends. Units are drawn from the devices connected now (a device that has not checked in
is not sent work); when none can be dispatched and none is in flight, the run waits for
devices up to `idle_timeout_s`. An arrival of a dispatch not in flight (a repeat, or
one from before a crash) is dropped and counted by the engine (`replays_dropped`), never
applied twice; a device's reply after its exchange gave up on it is dropped by the
transport and counted (`late_replies_dropped` in the summary, without DP). After a
crash, the checkpoint's units in flight are sent again when run() starts (their updates
are never stored), once the devices can have checked in.

The model depends on the order replies come in: two runs of one config reach the same
model only in simulation (sim_clock.py). Distributed DP is refused here
(fedveil.config.async_dp.check_wall_clock_dp says why); central DP runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from fedveil.config import RunConfig
from fedveil.config.async_dp import check_wall_clock_dp
from fedveil.server.engine.aggregation import NoUpdates
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.dispatches import Dispatch, DispatchRunner
from fedveil.server.engine.scheduler import EngineView
from fedveil.server.engine.wall_clock import WallClock, Work

log = logging.getLogger("fedveil.server")

__all__ = ["DeviceFleet", "DeviceScheduler"]

IDLE_TIMEOUT_S = 300.0  # how long a run with nothing in flight waits for devices
IDLE_POLL_S = 0.5
DRAIN_S = 60.0  # how long a finished run lets units still in flight come back
JOIN_S = 30.0  # how long it then waits for the threads of the units it called off


@runtime_checkable
class DeviceFleet(Protocol):
    """A transport to real devices (the coordinator's DeployTransport)."""

    late_replies: int

    def online(self) -> list[int]:
        """The clients connected now."""
        ...


class _SessionOnItsThread(DispatchRunner):
    """The unit runner whose secure-aggregation group does not run at dispatch: on the
    wall clock the group's session runs on the unit's thread (DeviceScheduler._work)."""

    def run_group(
        self,
        unit: Dispatch,
        weights: torch.Tensor,
        start: float | None = None,
        ready: Mapping[int, float] | None = None,
    ) -> float:
        return 0.0


class DeviceScheduler(BufferedScheduler):
    """server.mode = async | ssp on devices: the buffer of K, its arrivals in wall-clock
    order. What it adds to the buffer: where units go (the devices online), what each
    runs (its exchange, on a thread of its own), waiting for devices, and letting the
    units in flight end with the run."""

    def __init__(self, cfg: RunConfig, *, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        check_wall_clock_dp(cfg)  # distributed DP: refused on devices, naming why
        self.wall_clock = WallClock()
        super().__init__(cfg, availability=None, clock=self.wall_clock)
        self.idle_timeout_s = idle_timeout_s

    def attach(self, engine: EngineView) -> None:
        super().attach(engine)
        self.wall_clock.bind(self._work)
        transport = engine.transport
        self.fleet = transport if isinstance(transport, DeviceFleet) else None
        engine.annotators.append(lambda r: r.extra.update(clock="wall"))

    def _runner(self, engine: EngineView) -> DispatchRunner:
        return _SessionOnItsThread(
            self.cfg, engine.transport, engine.channel, engine.model.size, None,
            privacy_fields=engine.client_privacy,
        )  # fmt: skip

    # -- where units go, and what each runs ----------------------------------------
    def _pool(self) -> Sequence[int]:
        if self.fleet is None:
            return super()._pool()
        return self.fleet.online()

    def _work(self, seq: int) -> Work:
        """Unit `seq`'s exchange, its requests built here, on the engine's thread (the
        version it downloads, the DP clip of now); run on the unit's own thread."""
        unit = self.in_flight[seq]
        requests = self.runner.requests(unit, self.versions[unit.version])
        timeout, size = self.runner.timeout, self.engine.model.size
        channel, transport = self.engine.channel, self.engine.transport

        def work() -> None:
            try:
                unit.outcome = channel.collect(transport, requests, size, timeout)
            except Exception as exc:  # one unit's failure is its clients' drop, not the run's
                reason = f"exchange failed: {type(exc).__name__}: {exc}"[:200]
                log.warning("dispatch %d: %s", seq, reason)
                unit.outcome = NoUpdates({c: reason for c in unit.clients})
            finally:
                unit.computed = True

        return work

    def fill(self) -> None:
        """Dispatch into every free slot; with nothing in flight and nobody to dispatch
        to, wait for devices to check in (up to idle_timeout_s). No dispatch after the
        last server update: devices are not sent work whose update cannot be used."""
        if self.engine.round >= self.cfg.server.rounds:
            return
        super().fill()
        if self.in_flight or self._capped_out():
            return
        log.info("no unit in flight and no client to dispatch to: waiting for devices")
        deadline = time.monotonic() + self.idle_timeout_s
        while not self.in_flight and time.monotonic() < deadline:
            time.sleep(IDLE_POLL_S)
            super().fill()

    def _capped_out(self) -> bool:
        """Every client has reached its participation cap: waiting would not help."""
        everyone = list(range(self.engine.task.num_clients))
        cap = self.cfg.server.max_participations
        if cap and all(self.participations[c] >= cap for c in everyone):
            return True
        return self.dp is not None and not self.dp.eligible(everyone)

    # -- whole run ---------------------------------------------------------------
    def begin(self) -> None:
        # Units restored from a checkpoint go out now, not at restore: in a deployment the
        # devices check in again only after the engine is built.
        self.wall_clock.start()

    def end(self, failed: bool) -> None:
        # Units still in flight after the last update are let finish (a device is not left
        # training for a run that is over, which would delay its answer to the next run),
        # up to server.round_timeout (or DRAIN_S); their updates are not used.
        if not failed:
            self.wall_clock.join(self.cfg.server.round_timeout or DRAIN_S)
        self._call_off()

    def _call_off(self) -> None:
        """End the exchanges still waiting: the transport closes, the threads end."""
        self.engine.transport.close()
        if not self.wall_clock.join(JOIN_S):
            log.warning("unit threads still running %.0f s after the transport closed", JOIN_S)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["clock"] = "wall"
        if self.dp is None:  # counts: never public under DP
            out["units_unused_at_end"] = len(self.in_flight)
            if self.fleet is not None:
                out["late_replies_dropped"] = self.fleet.late_replies
        return out
