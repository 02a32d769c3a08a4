"""DeployTransport under an asynchronous run: exchanges at the same time on disjoint clients,
the end of a run cutting the waits short, and replies after an exchange gave up dropped
and counted (over a stand-in for the SuperLink Grid whose devices take their time; the
real Grid is exercised in test_deploy_async.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest
from flwr.app import Message
from test_deploy_transport import ScriptedGrid, client, transport

from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.transport import LEFT_OUT, ClientFailure

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast


class SlowGrid(ScriptedGrid):
    """Each node's reply becomes available `delay[node]` seconds after the push; the
    grid's calls come from several threads at once, as the SuperLink's do."""

    def __init__(self, nodes, delay: dict[int, float]) -> None:
        super().__init__(nodes)
        self.delay = delay
        self.ready_at: dict[str, float] = {}
        self.lock = threading.Lock()
        self.pulled: list[str] = []

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        with self.lock:
            ids = super().push_messages(messages)
            for msg_id, msg in zip(ids, messages, strict=True):
                is_hello = msg.metadata.message_type.endswith("hello")
                wait = 0.0 if is_hello else self.delay.get(msg.metadata.dst_node_id, 0.0)
                self.ready_at[msg_id] = time.monotonic() + wait
            return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        now = time.monotonic()
        with self.lock:
            ids = list(message_ids)
            self.pulled += ids
            ready = [m for m in ids if m in self.outbox and self.ready_at[m] <= now]
            return [self.outbox.pop(m) for m in ready]


def test_concurrent_exchanges_get_only_their_own_replies():
    nodes = {
        101 + c: client(c, train=lambda env: Envelope("train", env.round, {})) for c in range(4)
    }
    grid = SlowGrid(nodes, {101: 0.4, 102: 0.05, 103: 0.25, 104: 0.1})
    t = transport(grid)
    assert t.wait_for(4, timeout_s=2) == 4
    results: dict[int, dict] = {}
    ended: dict[int, float] = {}
    start = time.monotonic()

    def one(cid: int) -> None:  # unit cid's exchange: its round is its dispatch number
        results[cid] = t.exchange({cid: Envelope("train", 10 + cid, {})}, timeout_s=5)
        ended[cid] = time.monotonic() - start

    threads = [threading.Thread(target=one, args=(c,)) for c in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    for cid in range(4):
        (reply,) = results[cid].values()
        assert list(results[cid]) == [cid]
        assert isinstance(reply, Envelope) and reply.round == 10 + cid
    # Concurrent: the faster devices' exchanges ended first, whatever order they began in.
    assert sorted(ended, key=ended.get) == [1, 3, 2, 0]
    assert t.connected() == [0, 1, 2, 3] and t.late_replies == 0


def test_closing_ends_the_waits_and_later_exchanges():
    silent = {101: client(0, train=lambda env: None), 102: client(1)}
    t = transport(ScriptedGrid(silent))
    t.wait_for(2, timeout_s=2)
    out: dict = {}
    th = threading.Thread(
        target=lambda: out.update(t.exchange({0: Envelope("train", 3, {})}, timeout_s=None)),
        daemon=True,  # a transport that cannot be closed would wait forever
    )
    th.start()
    time.sleep(0.1)
    t.close()  # the run is over while device 0 is still training
    th.join(2)
    assert not th.is_alive()
    assert isinstance(out[0], ClientFailure) and out[0].reason == "the run has ended"
    after = t.exchange({1: Envelope("train", 4, {})}, timeout_s=1)
    assert isinstance(after[1], ClientFailure) and after[1].reason == "the run has ended"


def test_a_reply_after_the_deadline_is_dropped_and_counted():
    nodes = {101: client(0), 102: client(1)}
    grid = SlowGrid(nodes, {101: 0.3, 102: 0.0})
    t = transport(grid)
    t.wait_for(2, timeout_s=2)
    first = t.exchange({0: Envelope("train", 1, {})}, timeout_s=0.05)
    assert isinstance(first[0], ClientFailure) and "deadline" in first[0].reason
    time.sleep(0.35)  # device 0's reply to dispatch 1 is in now
    second = t.exchange({0: Envelope("train", 2, {}), 1: Envelope("train", 2, {})}, timeout_s=1)
    # Never handed to the next exchange of the same client: that one waits for its own.
    assert all(isinstance(r, Envelope) and r.round == 2 for r in second.values())
    assert t.late_replies == 1
    t.refresh()
    assert t.late_replies == 1  # counted once


def test_an_exchange_ended_at_its_first_r_replies_leaves_the_rest_out_and_drops_theirs():
    # An asynchronous secure-aggregation group released at R = 2 of G = 4
    # (server.group_release_at): the masked-input exchange ends at the second reply.
    nodes = {101 + c: client(c) for c in range(4)}
    grid = SlowGrid(nodes, {101: 0.05, 102: 1.0, 103: 0.0, 104: 1.2})
    t = transport(grid)
    assert t.wait_for(4, timeout_s=2) == 4
    start = time.monotonic()
    out = t.exchange_first({c: Envelope("train", 7, {}) for c in range(4)}, 5, quorum=2)
    took = time.monotonic() - start
    assert {c for c, r in out.items() if isinstance(r, Envelope)} == {0, 2}
    for cid in (1, 3):
        reply = out[cid]
        assert isinstance(reply, ClientFailure) and reply.reason.startswith(LEFT_OUT)
    assert took < 0.9  # it did not wait for the stragglers
    time.sleep(1.3)  # their replies to dispatch 7 are in now
    again = t.exchange({c: Envelope("train", 8, {}) for c in range(4)}, timeout_s=2)
    # Never handed to a later exchange: the left-out members' replies are late, counted.
    assert all(isinstance(r, Envelope) and r.round == 8 for r in again.values())
    assert t.late_replies == 2
