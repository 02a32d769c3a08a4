"""The asynchronous engine (server.mode = async | ssp) on the tiny task: FedBuff's
buffered, staleness-weighted updates, the SSP gate, stale and replayed arrivals, and
that the same config and seed give the same model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

import tiny_task
from fedveil.config import load_config
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.staleness import ssp_allows, staleness_weight, too_stale
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport


def async_config(tmp_path, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 6,
        "server.mode": "async",
        "server.buffer": 2,
        "client.momentum": 0.5,
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "simulation.workers": 1,  # in process (fast tier): same result as workers
        "out": str(tmp_path / "run"),
    }
    values.update(extra)
    return load_config(None, values)


class Recording:
    """Keeps every training reply's update, by dispatch number (the request's round)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.deltas: dict[int, torch.Tensor] = {}
        self.clients: dict[int, int] = {}

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        replies = self.inner.exchange(requests, timeout_s)
        for cid, reply in replies.items():
            if isinstance(reply, Envelope) and reply.kind == "train":
                self.deltas[reply.round] = reply.tensor(F.DELTA).clone()
                self.clients[reply.round] = cid
        return replies

    def close(self) -> None:
        self.inner.close()


def build(cfg, tmp_path, wrap=None):
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    transport = InProcessTransport(task)
    outer = transport if wrap is None else wrap(transport)
    availability = AvailabilityModel.from_config(cfg)
    scheduler = BufferedScheduler(cfg, availability=availability)
    return RoundEngine(cfg, task, outer, channel=channel, scheduler=scheduler), outer


def test_staleness_weight_and_limits():
    assert staleness_weight(0, 0.5) == 1.0
    assert staleness_weight(3, 0.5) == pytest.approx(0.5)  # FedBuff's 1/sqrt(1+tau)
    assert staleness_weight(7, 0.0) == 1.0
    assert not too_stale(100, 0) and too_stale(3, 2) and not too_stale(2, 2)
    assert ssp_allows(5, None, 0) and ssp_allows(5, 3, 2) and not ssp_allows(6, 3, 2)
    with pytest.raises(ValueError, match="staleness = -1"):
        staleness_weight(-1, 0.5)


def test_k1_is_plain_async_sgd_with_staleness_weights(tmp_path):
    """K = 1: every arrival is one server step, w += s(tau) * delta (FedAvg, lr 1)."""
    cfg = async_config(tmp_path, **{"server.buffer": 1, "server.rounds": 10})
    engine, rec = build(cfg, tmp_path, Recording)
    w0 = engine.weights.clone()
    engine.run()
    assert len(engine.history) == 10
    expected = w0.clone()
    taus = []
    for r in engine.history:
        (seq,) = r.extra["applied_dispatches"]
        (tau,) = r.extra["staleness"]
        taus.append(tau)
        assert r.cohort_aggregated == 1
        expected = expected + staleness_weight(tau, 0.5) * rec.deltas[seq]
    assert any(t > 0 for t in taus)  # 6 in flight: some updates are stale
    torch.testing.assert_close(engine.weights, expected, rtol=1e-5, atol=1e-6)


def test_buffer_mean_weights_updates_by_staleness_and_examples(tmp_path):
    cfg = async_config(tmp_path, **{"server.buffer": 3, "server.rounds": 4})
    engine, rec = build(cfg, tmp_path, Recording)
    task = engine.task
    expected = engine.weights.clone()
    engine.run()
    for r in engine.history:
        seqs, taus = r.extra["applied_dispatches"], r.extra["staleness"]
        sizes = [float(task.client_sizes[rec.clients[s]]) for s in seqs]
        num = sum(
            staleness_weight(t, 0.5) * n * rec.deltas[s]
            for s, t, n in zip(seqs, taus, sizes, strict=True)
        )
        expected = expected + num / sum(sizes)
        assert r.cohort_aggregated == 3 and r.extra["mode"] == "async"
        assert r.extra["sim_clock_s"] >= r.extra["sim_time_s"] > 0
    torch.testing.assert_close(engine.weights, expected, rtol=1e-5, atol=1e-6)


def test_updates_beyond_max_staleness_are_dropped_and_counted(tmp_path):
    cfg = async_config(
        tmp_path, **{"server.buffer": 1, "server.rounds": 12, "server.max_staleness": 1}
    )
    engine, _ = build(cfg, tmp_path)
    summary = engine.run()
    applied = [t for r in engine.history for t in r.extra["staleness"]]
    assert max(applied) <= 1
    dropped = sum(r.extra["stale_dropped"] for r in engine.history)
    assert dropped > 0 and summary["stale_dropped"] == dropped


def _spread_tracker(engine: RoundEngine) -> list[int]:
    """The widest gap between versions downloaded by units in flight together."""
    spreads: list[int] = []
    dispatch = engine.scheduler._dispatch

    def watched(clients):
        dispatch(clients)
        versions = [u.version for u in engine.scheduler.in_flight.values()]
        spreads.append(max(versions) - min(versions))

    engine.scheduler._dispatch = watched  # type: ignore[method-assign]
    return spreads


def test_ssp_gate_bounds_the_versions_in_flight(tmp_path):
    extra = {"server.buffer": 1, "server.rounds": 14, "simulation.latency_client_sigma": 1.5}
    free, _ = build(async_config(tmp_path, **extra), tmp_path)
    free_spreads = _spread_tracker(free)
    free.run()
    assert max(free_spreads) > 1  # without the gate, downloads drift apart
    gated, _ = build(
        async_config(tmp_path, **extra, **{"server.mode": "ssp", "server.ssp_bound": 1}), tmp_path
    )
    spreads = _spread_tracker(gated)
    gated.run()
    assert len(gated.history) == 14 and max(spreads) <= 1
    assert min(r.extra["in_flight"] for r in gated.history) < 6  # slots waited


def test_same_config_and_seed_give_the_same_model(tmp_path):
    cfg = async_config(tmp_path, **{"simulation.dropout": 0.2})
    a, _ = build(cfg, tmp_path)
    b, _ = build(cfg, tmp_path)
    a.run()
    b.run()
    assert torch.equal(a.weights, b.weights)
    assert [r.to_json()["staleness"] for r in a.history] == [
        r.to_json()["staleness"] for r in b.history
    ]
    assert sum(r.dropped for r in a.history) > 0  # dropouts happened, the same ones
    c, _ = build(async_config(tmp_path, seed=1, **{"simulation.dropout": 0.2}), tmp_path)
    c.run()
    assert not torch.equal(a.weights, c.weights)


def test_a_replayed_or_late_arrival_is_dropped_and_counted(tmp_path):
    cfg = async_config(tmp_path, **{"server.buffer": 1, "server.rounds": 3})
    engine, _ = build(cfg, tmp_path)
    engine.run()
    applied = engine.history[-1].extra["applied_dispatches"][0]
    before = engine.weights.clone()
    assert engine.scheduler.deliver(applied) is None  # already applied: a replay
    assert engine.scheduler.deliver(10_000) is None  # never dispatched
    assert torch.equal(engine.weights, before)
    assert engine.scheduler.window.replays_dropped == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"server.buffer": 7}, "server.buffer = 7: more than server.concurrency = 6"),
        ({"server.mode": "ssp", "server.ssp_bound": -1}, "server.ssp_bound = -1: must be >= 0"),
        ({"server.max_staleness": -1}, "server.max_staleness = -1: must be >= 0"),
        (
            {"dp.mechanism": "central", "dp.epsilon": 8.0},
            "dp.mechanism = 'central' with server.mode = 'async'",
        ),
        ({"server.max_participations": 1, "server.rounds": 7}, "server.max_participations = 1"),
        ({"server.concurrency": 13}, "server.concurrency = 13"),
        ({"secagg.enabled": True, "server.group_size": 1}, "server.group_size = 1"),
        (
            {"secagg.enabled": True, "server.buffer": 2, "server.group_size": 2},
            "server.group_size = 2",
        ),
    ],
)
def test_bad_async_settings_are_refused_naming_the_field(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        async_config(tmp_path, **extra)


def test_sync_mode_ignores_the_async_fields(tmp_path):
    cfg = async_config(tmp_path, **{"server.mode": "sync", "server.buffer": 50})
    assert cfg.server.mode == "sync"


def test_sync_rounds_carry_the_simulated_clock_with_a_latency_model(tmp_path):
    from fedveil.simulations.simulate_run import simulate

    cfg = async_config(tmp_path, **{"server.mode": "sync", "server.rounds": 3})
    simulate(cfg)
    rows = [json.loads(x) for x in Path(cfg.out, "metrics.jsonl").read_text().splitlines()]
    clock = 0.0
    for row in rows:
        clock += row["sim_time_s"]
        assert row["sim_clock_s"] == pytest.approx(clock, abs=1e-5)
    assert clock > 0


def test_a_run_whose_every_client_fails_stops_instead_of_dispatching_forever(tmp_path):
    from fedveil.simulations.failures import FailureLog, RunFailed, check_some_client_contributed

    cfg = async_config(tmp_path)
    task = tiny_task.make_nan(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    log = FailureLog(InProcessTransport(task))
    engine = RoundEngine(cfg, task, log, channel=channel, scheduler=BufferedScheduler(cfg))
    summary = engine.run()
    assert engine.round == 0 and "server.buffer" in summary["stopped_reason"]
    last = engine.history[-1]
    assert not last.applied and last.dropped == last.cohort_planned >= engine.scheduler.stall_limit
    with pytest.raises(RunFailed, match="every client failed"):
        check_some_client_contributed(engine.history, log)
