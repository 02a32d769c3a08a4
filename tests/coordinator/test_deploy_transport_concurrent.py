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


# Generous: each wait below ends as soon as its condition holds, so only a broken
# transport spends it; on a loaded 2-core machine a thread may wait seconds for a core.
PATIENCE_S = 30.0


class SlowGrid(ScriptedGrid):
    """Each node's reply becomes available `delay[node]` seconds after the push, or, for a
    node whose delay is None, once the test calls `release(node)` (then at once for later
    pushes too): the order of replies is the test's, not the machine's. The grid's calls
    come from several threads at once, as the SuperLink's do."""

    def __init__(self, nodes, delay: dict[int, float | None]) -> None:
        super().__init__(nodes)
        self.delay = dict(delay)
        self.ready_at: dict[str, float] = {}
        self.held: dict[str, int] = {}  # message id -> its node, until released
        self.lock = threading.Lock()
        self.pulled: list[str] = []

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        with self.lock:
            ids = super().push_messages(messages)
            for msg_id, msg in zip(ids, messages, strict=True):
                node = msg.metadata.dst_node_id
                hello = msg.metadata.message_type.endswith("hello")
                wait = 0.0 if hello else self.delay.get(node, 0.0)
                if wait is None:
                    self.held[msg_id] = node
                else:
                    self.ready_at[msg_id] = time.monotonic() + wait
            return ids

    def release(self, node: int) -> None:
        """`node`'s held replies are in now, and its later ones come at once."""
        with self.lock:
            self.delay[node] = 0.0
            for msg_id in [m for m, n in self.held.items() if n == node]:
                del self.held[msg_id]
                self.ready_at[msg_id] = time.monotonic()

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        now = time.monotonic()
        with self.lock:
            ids = list(message_ids)
            self.pulled += ids
            ready = [m for m in ids if m in self.outbox and m in self.ready_at]
            return [self.outbox.pop(m) for m in ready if self.ready_at[m] <= now]


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {PATIENCE_S:.0f} s"
        time.sleep(0.01)


def test_concurrent_exchanges_get_only_their_own_replies():
    nodes = {
        101 + c: client(c, train=lambda env: Envelope("train", env.round, {})) for c in range(4)
    }
    grid = SlowGrid(nodes, dict.fromkeys(range(101, 105)))  # every training reply held
    t = transport(grid)
    assert t.wait_for(4, timeout_s=PATIENCE_S) == 4
    results: dict[int, dict] = {}
    ended: list[int] = []

    def one(cid: int) -> None:  # unit cid's exchange: its round is its dispatch number
        results[cid] = t.exchange({cid: Envelope("train", 10 + cid, {})}, timeout_s=120)
        ended.append(cid)

    threads = [threading.Thread(target=one, args=(c,)) for c in range(4)]
    for th in threads:
        th.start()
    wait_until(lambda: len(grid.held) == 4, "all four exchanges pushed")
    # Concurrent: each exchange ends on its own device's reply, whatever order the
    # exchanges began in, while the others still wait (one at a time would hang here).
    order = [1, 3, 2, 0]
    for n, cid in enumerate(order):
        grid.release(101 + cid)
        wait_until(lambda cid=cid: cid in ended, f"the exchange of client {cid} to end")
        assert ended == order[: n + 1]
    for th in threads:
        th.join(PATIENCE_S)
    for cid in range(4):
        (reply,) = results[cid].values()
        assert list(results[cid]) == [cid]
        assert isinstance(reply, Envelope) and reply.round == 10 + cid
    assert t.connected() == [0, 1, 2, 3] and t.late_replies == 0


def test_closing_ends_the_waits_and_later_exchanges():
    silent = {101: client(0, train=lambda env: None), 102: client(1)}
    t = transport(ScriptedGrid(silent))
    t.wait_for(2, timeout_s=PATIENCE_S)
    out: dict = {}
    th = threading.Thread(
        target=lambda: out.update(t.exchange({0: Envelope("train", 3, {})}, timeout_s=None)),
        daemon=True,  # a transport that cannot be closed would wait forever
    )
    th.start()
    time.sleep(0.1)
    t.close()  # the run is over while device 0 is still training
    th.join(PATIENCE_S)
    assert not th.is_alive()
    assert isinstance(out[0], ClientFailure) and out[0].reason == "the run has ended"
    after = t.exchange({1: Envelope("train", 4, {})}, timeout_s=PATIENCE_S)
    assert isinstance(after[1], ClientFailure) and after[1].reason == "the run has ended"


def test_a_reply_after_the_deadline_is_dropped_and_counted():
    nodes = {101: client(0), 102: client(1)}
    grid = SlowGrid(nodes, {101: None, 102: 0.0})  # device 0's reply held past the deadline
    t = transport(grid)
    t.wait_for(2, timeout_s=PATIENCE_S)
    first = t.exchange({0: Envelope("train", 1, {})}, timeout_s=0.05)
    assert isinstance(first[0], ClientFailure) and "deadline" in first[0].reason
    grid.release(101)  # device 0's reply to dispatch 1 is in now
    second = t.exchange(
        {0: Envelope("train", 2, {}), 1: Envelope("train", 2, {})}, timeout_s=PATIENCE_S
    )
    # Never handed to the next exchange of the same client: that one waits for its own.
    assert all(isinstance(r, Envelope) and r.round == 2 for r in second.values())
    assert t.late_replies == 1
    t.refresh()
    assert t.late_replies == 1  # counted once


def test_an_exchange_ended_at_its_first_r_replies_leaves_the_rest_out_and_drops_theirs():
    # An asynchronous secure-aggregation group released at R = 2 of G = 4
    # (server.group_release_at): the masked-input exchange ends at the second reply.
    # The stragglers' replies are held until it has ended: an exchange that waited for
    # them would end only at its deadline, with "deadline" failures rather than LEFT_OUT.
    nodes = {101 + c: client(c) for c in range(4)}
    grid = SlowGrid(nodes, {101: 0.05, 102: None, 103: 0.0, 104: None})
    t = transport(grid)
    assert t.wait_for(4, timeout_s=PATIENCE_S) == 4
    start = time.monotonic()
    out = t.exchange_first(
        {c: Envelope("train", 7, {}) for c in range(4)}, 2 * PATIENCE_S, quorum=2
    )
    took = time.monotonic() - start
    assert {c for c, r in out.items() if isinstance(r, Envelope)} == {0, 2}
    for cid in (1, 3):
        reply = out[cid]
        assert isinstance(reply, ClientFailure) and reply.reason.startswith(LEFT_OUT)
    assert took < PATIENCE_S  # it did not wait for the stragglers, nor for its deadline
    grid.release(102)
    grid.release(104)  # their replies to dispatch 7 are in now
    again = t.exchange({c: Envelope("train", 8, {}) for c in range(4)}, timeout_s=PATIENCE_S)
    # Never handed to a later exchange: the left-out members' replies are late, counted.
    assert all(isinstance(r, Envelope) and r.round == 8 for r in again.values())
    assert t.late_replies == 2


def test_a_quorum_counts_only_replies_the_receiver_accepted():
    # A group's unmask ended at t = 2 replies (server.group_unmask = 'threshold'): a reply
    # the protocol server refused (here client 0's: its sink returns False) holds no
    # share, so the exchange waits for two accepted replies, and never ends with fewer
    # than t shares of a secret.
    nodes = {101 + c: client(c) for c in range(4)}
    grid = SlowGrid(nodes, {101: 0.0, 102: 0.0, 103: 0.3, 104: None})
    t = transport(grid)
    assert t.wait_for(4, timeout_s=PATIENCE_S) == 4
    handed: dict[int, Envelope | ClientFailure] = {}

    def sink(cid: int, reply: Envelope | ClientFailure) -> bool:
        handed[cid] = reply
        return cid != 0  # client 0's reply is refused

    out = t.exchange_first(
        {c: Envelope("secagg.unmask", 7, {}) for c in range(4)}, 2 * PATIENCE_S, 2, sink
    )
    assert {c for c, r in handed.items() if isinstance(r, Envelope)} == {0, 1, 2}
    assert set(out) == {3} and out[3].reason.startswith(LEFT_OUT)
    assert "first 2 usable replies to secagg.unmask" in out[3].reason


def test_replies_past_the_quorum_in_the_same_pull_are_left_out_and_counted_late():
    # Every device answers at once, so one pull brings all four replies: only the first
    # two reach the receiver (no more shares, or masked inputs, than the quorum), the
    # other two are left out and counted as late replies, never used.
    nodes = {101 + c: client(c) for c in range(4)}
    grid = SlowGrid(nodes, {101: 0.0, 102: 0.0, 103: 0.0, 104: 0.0})
    t = transport(grid)
    assert t.wait_for(4, timeout_s=PATIENCE_S) == 4
    handed: list[int] = []
    out = t.exchange_first(
        {c: Envelope("secagg.unmask", 8, {}) for c in range(4)},
        2 * PATIENCE_S,
        2,
        lambda cid, reply: handed.append(cid),
    )
    assert len(handed) == 2
    assert set(out) == {0, 1, 2, 3} - set(handed)
    assert all(r.reason.startswith(LEFT_OUT) for r in out.values())
    assert t.late_replies == 2
