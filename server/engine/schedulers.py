"""The scheduler for a run's server.mode (the Scheduler interface: scheduler.py).

sync          BarrierScheduler: one cohort per round, the round waits for it
async         BufferedScheduler: a server update after every K client updates
ssp           BufferedScheduler with server.ssp_bound: dispatch only within that
              many versions of the oldest download in flight
async | ssp   DeviceScheduler with `wall_clock` (a deployment's devices): the same
              buffer, units arriving when their exchanges end
"""

from __future__ import annotations

from fedveil.config import RunConfig
from fedveil.server.engine.barrier_scheduler import BarrierScheduler
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.device_scheduler import DeviceScheduler
from fedveil.server.engine.scheduler import Scheduler
from fedveil.server.engine.sim_clock import Availability


def make_scheduler(
    cfg: RunConfig, *, availability: Availability | None = None, wall_clock: bool = False
) -> Scheduler:
    """`availability`: the simulated latency and dropouts asynchronous arrivals follow
    (None: every unit takes 1 s); `wall_clock` changes nothing under sync."""
    if cfg.server.mode == "sync":
        return BarrierScheduler(cfg)
    if wall_clock:
        return DeviceScheduler(cfg)
    return BufferedScheduler(cfg, availability=availability)
