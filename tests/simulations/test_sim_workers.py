"""Worker processes: same results as one lane, sticky client state, big messages, crashes."""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import pytest
import torch

import tiny_task
from fedveil.client.runtime import ClientRuntime
from fedveil.config import load_config
from fedveil.model_evaluation import evaluate
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.shm import Arena, Packer, take
from fedveil.simulations.workers import WorkerPool, death_cause


def tiny_config(**extra):
    overrides = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 9,
        "server.rounds": 3,
        "client.momentum": 0.5,
        "client.weight_decay": 0.01,
    }
    overrides.update(extra)
    return load_config(None, overrides)


def final_weights(cfg, workers: int) -> torch.Tensor:
    task = tiny_task.make(cfg)
    with InProcessTransport(task, workers=workers) as transport:
        engine = RoundEngine(cfg, task, transport)
        engine.run()
    return engine.weights


@pytest.mark.procs
def test_workers_give_bit_identical_models_to_one_lane():
    cfg = tiny_config()
    one = final_weights(cfg, 1)
    assert torch.equal(one, final_weights(cfg, 2))
    assert torch.equal(one, final_weights(cfg, 3))
    assert not torch.equal(one, RoundEngine(cfg, tiny_task.make(cfg), _NoClients()).weights)


@pytest.mark.procs
def test_workers_evaluate_the_test_set_like_this_process():
    cfg = tiny_config()
    task = tiny_task.make(cfg)
    local = RoundEngine(cfg, task, _NoClients())
    x, y = task.test_data
    weights = local.weights + 0.3 * torch.randn(
        local.weights.shape, generator=torch.Generator().manual_seed(1)
    )
    want = evaluate(local.model, weights, x, y, task.loss_fn, 7)
    with InProcessTransport(task, workers=3) as transport:
        got = transport.evaluate_central(weights, 1, 7)
        assert got == want and want[2] == len(y)  # bit for bit, whoever evaluated what
        engine = RoundEngine(cfg, task, transport)
        engine.run()  # every round's test accuracy comes from the workers
        # An accuracy, not only a value: None and NaN both fail the comparison.
        assert engine.history and all(0.0 <= r.test_accuracy <= 1.0 for r in engine.history)
    with InProcessTransport(task, workers=1) as transport:
        assert transport.evaluate_central(weights, 1, 7) is None  # one lane: the engine does it


class _NoClients:
    def client_ids(self):
        return range(12)

    def exchange(self, requests, timeout_s, on_reply=None):
        return {}

    def close(self):
        return None


@pytest.mark.procs
def test_this_process_leaves_the_cores_to_the_workers_until_the_pool_closes():
    before = torch.get_num_threads()
    task = tiny_task.make(tiny_config())
    with InProcessTransport(task, workers=2) as transport:
        assert transport.workers == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _stateful_handle(self, client_id, msg, state):
    """A stand-in for a multi-stage protocol (secure aggregation's client is one)."""
    if msg.kind != "stage":
        return _real_handle(self, client_id, msg, state)
    state["calls"] = state.get("calls", 0) + 1
    blob = bytes([client_id % 256]) * int(msg.config["blob"])
    return Envelope(
        "stage",
        msg.round,
        {"calls": state["calls"], "pid": os.getpid(), "blob": blob},
        {"echo": msg.arrays["payload"] * 2, "ids": np.arange(client_id, dtype=np.int64)},
    )


_real_handle = ClientRuntime.handle


@pytest.mark.procs
def test_client_state_follows_the_client_into_the_next_round_and_not_beyond(monkeypatch):
    monkeypatch.setattr(ClientRuntime, "handle", _stateful_handle)  # before the fork
    task = tiny_task.make(tiny_config())
    pool = WorkerPool(task, 2)
    try:
        payload = torch.arange(1000, dtype=torch.float32)
        # 200 kB of config per message each way: more than a pipe buffer holds.
        msg = Envelope("stage", 1, {"blob": 200_000}, {"payload": payload})
        first = pool.run([[(c, msg)] for c in range(12)])
        second = pool.run([[(c, msg)] for c in range(12)])
        nxt = pool.run(
            [[(c, Envelope("stage", 2, {"blob": 10}, {"payload": payload}))] for c in range(12)]
        )
        later = pool.run(
            [[(c, Envelope("stage", 4, {"blob": 10}, {"payload": payload}))] for c in range(12)]
        )
    finally:
        pool.close()
    pids = {first[c].config["pid"] for c in range(12)}
    assert len(pids) == 2, "both workers took part"
    for c in range(12):
        assert first[c].config["calls"] == 1
        assert second[c].config["calls"] == 2, "the second stage found the first stage's state"
        assert second[c].config["pid"] == first[c].config["pid"]
        # Secure aggregation keys the next round during this one: state lives one round on.
        assert nxt[c].config["calls"] == 3 and nxt[c].config["pid"] == first[c].config["pid"]
        assert later[c].config["calls"] == 1, "state does not outlive the next round"
        assert first[c].config["blob"] == bytes([c]) * 200_000
        assert torch.equal(first[c].arrays["echo"], payload * 2)
        assert np.array_equal(first[c].arrays["ids"], np.arange(c))


@pytest.mark.procs
def test_a_crashed_worker_fails_its_clients_and_is_replaced(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="fedveil")
    cfg = tiny_config(**{"server.per_round": 12})
    task = tiny_task.make(cfg)
    honest = task.client_data
    flag = tmp_path / "crashed"

    def crash_once(cid):
        if cid == 7 and not flag.exists():
            flag.write_text("x")
            os._exit(3)
        return honest(cid)

    task.client_data = crash_once
    with InProcessTransport(task, workers=2) as transport:
        engine = RoundEngine(cfg, task, transport)
        request = engine.train_request(1)
        replies = transport.exchange({c: request for c in range(12)}, None)
        failed = {c: r for c, r in replies.items() if isinstance(r, ClientFailure)}
        assert 7 in failed and "died (exit code 3) while running " in failed[7].reason
        # It counts the clients it was running (each failure is keyed by its client) and
        # names none of them: under DP who ran is private (issue 28).
        running = int(failed[7].reason.rsplit("while running ", 1)[1].split(" ")[0])
        assert 1 <= running <= len(failed)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        died = [m for m in warnings if "died" in m]
        assert died and not any(re.search(r"client\(s\) \d", m) for m in died), died
        assert len(failed) < 12, "the other worker's clients were unaffected"
        again = transport.exchange({c: engine.train_request(2) for c in range(12)}, None)
        assert not any(isinstance(r, ClientFailure) for r in again.values())


def test_a_worker_death_is_said_in_words():
    assert death_cause(3) == "exit code 3"
    assert death_cause(-9).startswith("killed by SIGKILL: out of memory?")
    assert death_cause(-11).startswith("killed by SIGSEGV: a crash in native code")
    assert death_cause(None) == "it did not exit"


@pytest.mark.procs
def test_spawned_workers_need_a_task_factory():
    task = tiny_task.make(tiny_config())
    with pytest.raises(ValueError, match=r"simulation\.workers = 2 with 3 torch threads"):
        WorkerPool(task, 2, threads=3)


@pytest.mark.procs
@pytest.mark.slow
def test_spawned_workers_with_several_threads_match_one_lane():
    cfg = tiny_config()
    task = tiny_task.make(cfg)
    with InProcessTransport(task, workers=1) as lane:
        want = lane.exchange({c: _request(cfg, task) for c in range(6)}, None)
    pool = WorkerPool(task, 2, threads=2, task_factory=_TinyFactory(cfg))
    try:
        assert pool.method == "spawn"
        got = pool.run([[(c, _request(cfg, task))] for c in range(6)])
    finally:
        pool.close()
    for c in range(6):
        assert torch.equal(got[c].arrays["delta"], want[c].arrays["delta"])


@pytest.mark.procs
def test_a_worker_with_nothing_queued_gets_its_next_chunk_before_the_copying_out():
    cfg = tiny_config()
    task = tiny_task.make(cfg)
    request = _request(cfg, task)
    stats = []
    pool = WorkerPool(task, 2, on_exchange=stats.append)
    try:
        # Three one-client units on two workers: one each, the third held back for
        # whichever finishes first (a slowed worker never holds it queued).
        got = pool.run([[(c, request)] for c in range(3)])
    finally:
        pool.close()
    assert sorted(got) == [0, 1, 2] and all(isinstance(r, Envelope) for r in got.values())
    (st,) = stats
    assert sorted(c.clients for c in st.chunks) == [1, 1, 1]
    assert st.request_bytes == request.arrays["model"].numel() * 4  # the model, packed once
    assert sum(c.reply_bytes for c in st.chunks) >= 3 * st.request_bytes
    first, *_, third = sorted(st.chunks, key=lambda c: c.sent)
    assert third.sent > min(c.received for c in st.chunks)  # held back, sent on a return
    freed = next(c for c in st.chunks if c.worker == third.worker and c is not third)
    # It was sent as soon as its worker's first chunk came back, before that chunk's
    # replies were copied out of shared memory: the worker does not wait for the copy.
    assert freed.received <= third.sent < freed.copied
    assert all(c.sent <= c.started <= c.ended <= c.received <= c.copied for c in st.chunks)
    assert st.begun <= st.packed <= first.sent and max(c.copied for c in st.chunks) <= st.finished


@pytest.mark.procs
def test_each_worker_starts_on_the_lowest_client_ids_so_replies_come_back_in_order():
    cfg = tiny_config()
    task = tiny_task.make(cfg)
    request = _request(cfg, task)
    stats = []
    pool = WorkerPool(task, 2, on_exchange=stats.append)
    try:
        got = pool.run([[(c, request)] for c in range(4)])
    finally:
        pool.close()
    assert sorted(got) == [0, 1, 2, 3]
    (st,) = stats
    by_worker = {
        i: [c.first_client for c in sorted(st.chunks, key=lambda c: c.sent) if c.worker == i]
        for i in range(2)
    }
    # Worker 0 starts on client 0 and has client 2 queued behind it; worker 1 starts on
    # client 1 (before: worker 0 had 0 and 1, so 2's reply held up the in-order sum).
    assert by_worker[0][:2] == [0, 2] and by_worker[1][0] == 1
    assert sorted(by_worker[0] + by_worker[1]) == [0, 1, 2, 3]


class _TinyFactory:
    def __init__(self, cfg):
        self.cfg = cfg

    def __call__(self):
        return tiny_task.make(self.cfg)


def _request(cfg, task):
    return RoundEngine(cfg, task, _NoClients()).train_request(1)


@pytest.mark.parametrize(
    "value",
    [
        torch.randn(3, 5),
        torch.arange(10, dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.tensor(2.5),
        torch.empty(0, 4),
        np.arange(7, dtype=np.uint8),
        np.array([[1.5, -2.0]], dtype=np.float64),
        np.zeros((0,), dtype=np.int32),
    ],
    ids=lambda v: f"{type(v).__name__}-{v.dtype}-{tuple(v.shape)}",
)
def test_arrays_round_trip_through_an_arena(value):
    arena = Arena.create("test", size=64)
    try:
        packer = Packer(arena)
        packer.put(torch.ones(100))  # something before it, so offsets are exercised
        ref = packer.put(value)
        back = take(arena, ref)
    finally:
        arena.close()
    assert type(back) is type(value)
    assert back.dtype == value.dtype and tuple(back.shape) == tuple(value.shape)
    if isinstance(value, torch.Tensor):
        assert torch.equal(back, value)
    else:
        assert np.array_equal(back, value)


def test_arena_grows_and_readers_remap():
    writer = Arena.create("grow", size=64)
    reader = Arena.attach(writer.owner, inherited=False)  # through /proc, like a spawned worker
    try:
        small = Packer(writer).put(torch.ones(4))
        assert torch.equal(take(reader, small), torch.ones(4))
        big = Packer(writer).put(torch.arange(1 << 18, dtype=torch.float32))
        assert writer.size() >= (1 << 20)
        assert torch.equal(take(reader, big), torch.arange(1 << 18, dtype=torch.float32))
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize(
    ("requested", "clients", "started"), [(1024, 4, 4), (0, 1, 1), (3, 12, 3), (12, 12, 12)]
)
def test_a_run_never_starts_more_workers_than_it_has_clients(requested, clients, started):
    from fedveil.simulations.run_setup import resolve_workers

    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": clients,
            "server.per_round": clients,
            "simulation.workers": requested,
        },
    )
    assert resolve_workers(cfg, torch.device("cpu")) == started
