"""Asynchronous training survives a crash mid-stream (no update applied twice, the same
model as an uninterrupted run), and runs secure aggregation in groups: a group's sum is
the clear sum (to the quantizer's tolerance), and an aborted group's updates are lost."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport


def async_config(out, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 6,
        "server.mode": "async",
        "server.buffer": 2,
        "server.optimizer": "fedavgm",
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "simulation.dropout": 0.1,
        "out": str(out),
    }
    values.update(extra)
    return load_config(None, values)


class Crash(Exception):
    pass


class CrashAfter:
    """Raises on its n-th exchange: the server process dies mid-stream."""

    def __init__(self, inner: Transport, n: int) -> None:
        self.inner, self.left = inner, n

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        self.left -= 1
        if self.left == 0:
            raise Crash("killed")
        return self.inner.exchange(requests, timeout_s)

    def close(self) -> None:
        self.inner.close()


def run_lifecycle(cfg, wrap=None, resume=False) -> RoundEngine:
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    if not resume:
        store.clear()
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        outer = transport if wrap is None else wrap(transport)
        engine = life.engine(outer, resume=resume, availability=AvailabilityModel.from_config(cfg))
        assert isinstance(engine.scheduler, BufferedScheduler)
        engine.run()
    return engine


SECURE = {"secagg.enabled": True, "server.group_size": 3, "server.buffer": 3, "server.rounds": 4}
# Groups of 4 of C = 6 dispatched as slots come free: a unit in flight at the checkpoint
# may hold members that start late, and its recomputation must start them as late.
ROLLING = {**SECURE, "server.group_size": 4, "server.group_dispatch_at": 1}
# Late members on the model current at their start: a group in flight at the checkpoint
# has not run its session yet (it runs at its arrival), and its members' versions must
# still be at hand, and found the same, after the resume.
LATE = {**ROLLING, "server.group_member_model": "start"}


@pytest.mark.parametrize(
    ("extra", "crash_at"),
    [({}, 4), (SECURE, 22), (ROLLING, 22), (LATE, 10)],
    ids=["clear", "secagg", "secagg_rolling", "secagg_late_members"],
)
def test_a_run_killed_mid_stream_resumes_to_the_uninterrupted_model(tmp_path, extra, crash_at):
    straight = run_lifecycle(async_config(tmp_path / "straight", **extra))
    cfg = async_config(tmp_path / "crashed", **extra)
    with pytest.raises(Crash):
        run_lifecycle(cfg, wrap=lambda t: CrashAfter(t, crash_at))
    store = RunStore(cfg.out)
    done = [r["round"] for r in store.read_metrics()]
    assert 0 < len(done) < cfg.server.rounds, "the crash came mid-run, after a checkpoint"
    resumed = run_lifecycle(cfg, resume=True)
    if extra:  # stochastic rounding draws OS randomness: equal to the quantizer's error
        torch.testing.assert_close(resumed.weights, straight.weights, rtol=0, atol=2e-3)
    else:
        assert torch.equal(resumed.weights, straight.weights)
    assert [r["round"] for r in store.read_metrics()] == list(range(1, cfg.server.rounds + 1))
    applied = [s for r in store.read_metrics() for s in r["applied_dispatches"]]
    assert len(applied) == len(set(applied)), "no dispatch applied twice"
    assert applied == [s for r in straight.history for s in r.extra["applied_dispatches"]]
    ckpt = torch.load(store.checkpoint_path, weights_only=False)
    assert "delta" not in repr(ckpt["async"]["in_flight"]), "no client update on disk"


def engine_for(cfg, tmp_path) -> RoundEngine:
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    availability = AvailabilityModel.from_config(cfg)
    transport = InProcessTransport(task)
    scheduler = BufferedScheduler(cfg, availability=availability)
    return RoundEngine(cfg, task, transport, channel=channel, scheduler=scheduler)


GROUPED = {
    "server.concurrency": 6,
    "server.buffer": 3,
    "server.group_size": 3,
    "server.rounds": 4,
    "simulation.latency_median": 0.0,  # fixed 1 s per unit: both runs on one schedule
    "simulation.dropout": 0.0,
}


def test_secagg_groups_reach_the_clear_model_on_the_same_schedule(tmp_path):
    clear = engine_for(async_config(tmp_path / "a", **GROUPED), tmp_path)
    secure = engine_for(
        async_config(tmp_path / "b", **GROUPED, **{"secagg.enabled": True}), tmp_path
    )
    w0 = clear.weights.clone()
    clear.run()
    secure.run()
    assert secure.scheduler.secagg and not clear.scheduler.secagg
    for a, b in zip(clear.history, secure.history, strict=True):
        assert a.extra["applied_dispatches"] == b.extra["applied_dispatches"]
        assert a.extra["staleness"] == b.extra["staleness"] and b.cohort_aggregated == 3
    torch.testing.assert_close(secure.weights, clear.weights, rtol=0, atol=2e-3)
    assert (clear.weights - w0).abs().max() > 100 * 2e-3, "the model trained"


def test_an_aborted_group_is_lost_and_counted(tmp_path):
    # Half the clients drop at masked input: a group of 3 then has fewer than its
    # threshold of survivors, aborts before unmasking, and none of its updates count.
    cfg = async_config(
        tmp_path,
        **GROUPED,
        **{"secagg.enabled": True, "simulation.dropout_stages": "secagg.masked_input=0.5"},
    )
    engine = engine_for(cfg, tmp_path)
    engine.run()
    aborted = sum(r.extra["aborted_groups"] for r in engine.history)
    assert aborted > 0
    for r in engine.history:
        assert r.cohort_aggregated == len(r.extra["staleness"])
        assert r.cohort_aggregated + r.dropped <= r.cohort_planned
