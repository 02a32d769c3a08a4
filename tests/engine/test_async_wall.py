"""The asynchronous engine on the wall clock (async_wall.py), as a deployment runs it:
units come back when their devices answer, C in flight at once, a late or repeated
arrival never applied twice. Devices here are in-process clients that take their time
(the real SuperLink and SuperNodes: tests/coordinator/test_deploy_async.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest
import torch

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.device_scheduler import DeviceScheduler
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.server.engine.wall_clock import WallClock
from fedveil.simulations.inprocess import InProcessTransport


class SlowDevices:
    """Devices that each take `delay(seq)` seconds per training request, all at once; the
    in-process clients behind them train one at a time (they share one model)."""

    def __init__(self, inner: Transport, delay) -> None:
        self.inner, self.delay = inner, delay
        self.lock = threading.Lock()
        self.busy = 0
        self.most_busy = 0
        self.finished: list[int] = []  # dispatch numbers, in the order they finished
        self.closed = False

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        seq = next(iter(requests.values())).round
        with self.lock:
            self.busy += len(requests)
            self.most_busy = max(self.most_busy, self.busy)
        time.sleep(self.delay(seq))
        with self.lock:
            replies = self.inner.exchange(requests, timeout_s)
            self.busy -= len(requests)
            self.finished.append(seq)
        return replies

    def close(self) -> None:
        self.closed = True


def wall_engine(tmp_path, delay, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 10,
        "server.per_round": 4,
        "server.rounds": 5,
        "server.mode": "async",
        "server.buffer": 2,
        "client.momentum": 0.5,
        "out": str(tmp_path / "run"),
    }
    values.update(extra)
    cfg = load_config(None, values)
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    # The clients hold the run's config, as in a run: async keeps their sessions by dispatch.
    devices = SlowDevices(InProcessTransport(task, run_config=cfg), delay)
    scheduler = DeviceScheduler(cfg)
    return RoundEngine(cfg, task, devices, channel=channel, scheduler=scheduler), devices


def test_units_arrive_in_wall_clock_order_with_c_in_flight(tmp_path):
    # Dispatches 1 and 2 are slow devices: the first update is made of later dispatches,
    # and theirs come in stale.
    engine, devices = wall_engine(tmp_path, lambda seq: 0.8 if seq in (1, 2) else 0.05)
    summary = engine.run()
    history = engine.history
    assert [r.round for r in history] == [1, 2, 3, 4, 5]
    assert 1 not in history[0].extra["applied_dispatches"]
    assert 2 not in history[0].extra["applied_dispatches"]
    applied = [s for r in history for s in r.extra["applied_dispatches"]]
    assert len(applied) == len(set(applied)) == 10  # K = 2 per version, none twice
    staleness = {
        s: tau
        for r in history
        for s, tau in zip(r.extra["applied_dispatches"], r.extra["staleness"], strict=True)
    }
    assert staleness.get(1, 1) > 0 and max(staleness.values()) > 0
    assert all(r.extra["clock"] == "wall" and r.extra["in_flight"] <= 4 for r in history)
    # C = 4 devices trained at once, never more; the order is the devices', not dispatch's.
    assert devices.most_busy == 4
    assert devices.finished[:2] != [1, 2]
    assert summary["clock"] == "wall" and summary["updates_applied"] == 10
    assert devices.closed  # units still in flight at the end were called off


def test_a_repeated_or_late_arrival_is_dropped_and_counted(tmp_path):
    engine, _ = wall_engine(tmp_path, lambda seq: 0.01, **{"server.rounds": 2})
    engine.run()
    before = engine.weights.clone()
    applied = engine.history[-1].extra["applied_dispatches"][0]
    assert engine.scheduler.deliver(applied) is None  # its reply again
    assert engine.scheduler.deliver(10_000) is None  # a dispatch of before a crash
    assert torch.equal(engine.weights, before)
    assert engine.scheduler.window.replays_dropped == 2


def test_the_clock_hands_back_a_unit_reported_twice_twice():
    clock = WallClock()
    clock.bind(lambda seq: lambda: None)
    clock.schedule(7, 0.0)
    assert clock.next_arrival() is None  # held until start()
    clock.start()
    clock.schedule(7, 0.0)  # the same dispatch started again (never by the engine)
    got = [clock.next_arrival(), clock.next_arrival()]
    assert [seq for _, seq in got] == [7, 7] and clock.next_arrival() is None


def test_a_failing_exchange_drops_its_clients_not_the_run(tmp_path):
    def delay(seq: int) -> float:
        if seq == 3:
            raise ConnectionError("device link reset")
        return 0.01

    engine, _ = wall_engine(tmp_path, delay, **{"server.rounds": 3})
    engine.run()
    assert len(engine.history) == 3
    reasons = [why for r in engine.history for why in r.extra["drops_by_reason"]]
    assert "exchange failed" in reasons, reasons
    assert "ConnectionError: device link reset" in (engine.first_client_error or "")


def test_ssp_gate_holds_on_the_wall_clock(tmp_path):
    """Dispatch 1 is a slow device: under ssp (S = 1) no unit downloads a version more
    than 1 ahead of it while it is in flight, so slots wait for it."""
    engine, _ = wall_engine(
        tmp_path,
        lambda seq: 0.6 if seq == 1 else 0.02,
        **{"server.mode": "ssp", "server.ssp_bound": 1, "server.buffer": 1},
    )
    spreads: list[int] = []
    dispatch = engine.scheduler._dispatch

    def watched(clients: list[int]) -> None:
        dispatch(clients)
        versions = [u.version for u in engine.scheduler.in_flight.values()]
        spreads.append(max(versions) - min(versions))

    engine.scheduler._dispatch = watched  # type: ignore[method-assign]
    engine.run()
    assert len(engine.history) == 5 and max(spreads) <= 1
    assert min(r.extra["in_flight"] for r in engine.history) < 4  # slots waited


def test_secure_aggregation_groups_run_at_once_on_the_wall_clock(tmp_path):
    """Two groups of G = 3 in flight (C = 6), each one protocol session on its own thread:
    every version is a group's masked sum, none aborted."""
    engine, devices = wall_engine(
        tmp_path,
        lambda seq: 0.05,
        **{
            "secagg.enabled": True,
            "server.per_round": 6,
            "server.group_size": 3,
            "server.buffer": 3,
            "server.rounds": 3,
        },
    )
    engine.run()
    assert engine.scheduler.secagg and len(engine.history) == 3
    for r in engine.history:
        assert r.cohort_aggregated == 3 and r.extra["aborted_groups"] == 0
        assert len(r.extra["applied_dispatches"]) == 1  # one group: its sum only
    assert devices.most_busy == 6  # both groups' members at once


class Crash(Exception):
    pass


def test_a_crash_mid_stream_resumes_without_applying_a_dispatch_twice(tmp_path):
    """The coordinator dies after update 2 (checkpointed, units in flight); the next
    attempt sends those units again and goes on: every update once, none lost."""
    from fedveil.server.engine.runstore import RunStore

    store = RunStore(tmp_path / "run")

    def crash_after_2(record) -> None:
        if record.round == 2:
            raise Crash

    first, _ = wall_engine(tmp_path, lambda seq: 0.02 * (seq % 3))
    first.store, first.on_round = store, crash_after_2
    with pytest.raises(Crash):
        first.run()
    in_flight = sorted(first.scheduler.in_flight)
    assert in_flight  # the checkpoint holds units in flight
    second, devices = wall_engine(tmp_path, lambda seq: 0.02)
    second.store = store
    second.restore(store.load_checkpoint())
    assert second.round == 2 and sorted(second.scheduler.in_flight) == in_flight
    assert second.scheduler.wall_clock.in_flight() == 0  # sent again by run(), once devices can be
    second.run()
    records = store.read_metrics()
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5]
    applied = [s for r in records for s in r["applied_dispatches"]]
    assert len(applied) == len(set(applied)) == 10
    assert set(in_flight) <= set(devices.finished)  # sent again, not forgotten


def test_a_run_whose_clients_are_all_at_their_cap_stops_without_waiting(tmp_path):
    def delay(seq: int) -> float:
        if seq == 3:
            raise ConnectionError("device gone")  # one update lost: 9 for 5 x K = 10
        return 0.01

    engine, _ = wall_engine(tmp_path, delay, **{"server.max_participations": 1})
    start = time.monotonic()
    engine.run()
    assert len(engine.history) == 4 and "max_participations" in (engine.stopped_reason or "")
    assert time.monotonic() - start < 20  # not the 300 s wait for devices to check in
