"""Issue 33: heartbeats written in batches (server/coordinator/heartbeats.py).

The SuperLink process of test_fleet_idle_polls (idle_link_child.py: Flower's app on an
SQLite file, fedveil's Fleet listener on a loopback port), here with heartbeats
batched, and devices whose every request is built and signed by Flower's own SuperNode
client code with real P-256 keys. The test reads the SQLite file itself (a connection
of its own, outside the SuperLink) to see what is written when. What must hold:

- a heartbeat is answered while another connection holds SQLite's write lock (Flower
  writes it on the request's path: it waits, then fails), and reaches the database
  within the flush interval once the lock is free, with the `online_until` its arrival
  set, not its write;
- while a heartbeat is still pending, Flower's read of the node (get_node_info, behind
  node listings, the ServerApp's node ids and offline tagging) sees it: an offline node
  that heartbeats is online for that read, and the read wrote it;
- a node that stops heartbeating goes offline when its last heartbeat's patience ends;
- a deleted node's key no longer authenticates (heartbeat and pull refused 401), and its
  last pending heartbeat does not bring it back;
- a forged signature and another node's key are refused 401, and nothing is noted.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.constant import HEARTBEAT_PATIENCE
from flwr.proto.fleet_pb2 import DeactivateNodeRequest, PullMessagesRequest
from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest, SendNodeHeartbeatResponse
from flwr.proto.node_pb2 import Node
from flwr.supercore.utils import uint64_to_int64
from test_fleet_idle_polls import Link, _device

from fedveil.benchmarks.fleet_wire import build, capturing_client

pytestmark = pytest.mark.procs  # starts SuperLink processes

INTERVAL = 10.0  # Flower's smallest heartbeat interval: patience ends 20 s after a beat


def _start(state: Path, flush_s: float) -> Link:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("idle_link_child.py")),
            str(state),
            str(flush_s),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        return Link(proc)
    except BaseException:
        proc.kill()
        raise


def _stop(link: Link) -> None:
    link.http.close()
    link.proc.kill()
    link.proc.wait(10)


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Link, Path]]:
    """Heartbeats flushed every 0.5 s, as in `fedveil server`."""
    state = tmp_path_factory.mktemp("hb-fast")
    link = _start(state, 0.5)
    yield link, state / "superlink.db"
    _stop(link)


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Link, Path]]:
    """Heartbeats flushed only every hour: what is written came from a read's flush."""
    state = tmp_path_factory.mktemp("hb-slow")
    link = _start(state, 3600.0)
    yield link, state / "superlink.db"
    _stop(link)


def _heartbeat(link: Link, key: ec.EllipticCurvePrivateKey, node: int) -> bool:
    req = SendNodeHeartbeatRequest(node=Node(node_id=node), heartbeat_interval=INTERVAL)
    r = link.send(build(capturing_client("fleet:443", key), "SendNodeHeartbeat", req))
    assert r.status_code == 200, (r.status_code, r.text)
    res = SendNodeHeartbeatResponse()
    res.ParseFromString(r.content)
    return bool(res.success)


def _stored(db: Path, node: int) -> tuple[str, float | None, float | None]:
    """The node's status, online_until and heartbeat interval as committed in the file."""
    with sqlite3.connect(db, timeout=30) as conn:
        row = conn.execute(
            "SELECT status, online_until, heartbeat_interval FROM node WHERE node_id = ?",
            (uint64_to_int64(node),),
        ).fetchone()
    assert row is not None
    return str(row[0]), row[1], row[2]


def test_a_heartbeat_is_answered_while_sqlite_is_locked_and_written_within_the_interval(
    fast: tuple[Link, Path],
) -> None:
    link, db = fast
    key, node = _device(link)
    locker = sqlite3.connect(db, timeout=30, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # SQLite's one write lock, held by someone else
    try:
        sent = time.time()
        assert _heartbeat(link, key, node)
        answered = time.time()
        # Flower writes a heartbeat on its request's path: it would wait for the lock
        # (5 s, then a 500). Answered from memory, it does not wait.
        assert answered - sent < 4.0, f"heartbeat answered after {answered - sent:.2f} s"
        assert link.ask(op="pending")["pending"] == 1
        assert _stored(db, node)[2] == 30.0  # still the activation's interval: not written
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    deadline = time.time() + 5.0
    while link.ask(op="pending")["pending"] and time.time() < deadline:
        time.sleep(0.1)
    status, until, interval = _stored(db, node)
    assert (status, interval) == ("online", INTERVAL)
    assert until is not None
    # online_until as Flower computes it at the heartbeat's arrival, not at its write.
    assert sent + HEARTBEAT_PATIENCE * INTERVAL <= until <= answered + HEARTBEAT_PATIENCE * INTERVAL


def test_a_pending_heartbeat_is_seen_by_flowers_read_of_the_node(
    slow: tuple[Link, Path],
) -> None:
    link, db = slow
    key, node = _device(link)
    r = link.send(
        build(
            capturing_client("fleet:443", key),
            "DeactivateNode",
            DeactivateNodeRequest(node_id=node),
        )
    )
    assert r.status_code == 200, r.text
    assert link.ask(op="node", node=node)["status"] == "offline"

    sent = time.time()
    assert _heartbeat(link, key, node)
    answered = time.time()
    # Still pending (the flusher ticks hourly here): not in the file yet.
    assert link.ask(op="pending")["pending"] == 1
    assert _stored(db, node)[0] == "offline"

    info = link.ask(op="node", node=node)  # Flower's get_node_info: flushes first
    assert info["status"] == "online"
    patience = HEARTBEAT_PATIENCE * INTERVAL
    assert sent + patience <= info["online_until"] <= answered + patience
    assert link.ask(op="pending")["pending"] == 0
    assert _stored(db, node)[0] == "online"


def test_a_node_that_stops_heartbeating_goes_offline_on_time(fast: tuple[Link, Path]) -> None:
    link, _db = fast
    key, node = _device(link)
    sent = time.time()
    assert _heartbeat(link, key, node)
    answered = time.time()
    patience = HEARTBEAT_PATIENCE * INTERVAL
    assert link.ask(op="node", node=node)["status"] == "online"
    time.sleep(max(0.0, sent + patience - 1.0 - time.time()))
    status = link.ask(op="node", node=node)["status"]
    if time.time() < sent + patience:  # the read was done before the patience ended
        assert status == "online"
    time.sleep(max(0.0, answered + patience + 0.5 - time.time()))
    assert link.ask(op="node", node=node)["status"] == "offline"  # 0.5 s after it


def test_a_deleted_nodes_key_no_longer_authenticates(fast: tuple[Link, Path]) -> None:
    link, db = fast
    key, node = _device(link)
    assert _heartbeat(link, key, node)  # pending when the node is deleted
    hits = link.ask(op="key_hits")["hits"]
    assert _heartbeat(link, key, node)
    assert link.ask(op="key_hits")["hits"] == hits + 1  # its key's node id from memory
    link.ask(op="delete", node=node)
    req = SendNodeHeartbeatRequest(node=Node(node_id=node), heartbeat_interval=INTERVAL)
    r = link.send(build(capturing_client("fleet:443", key), "SendNodeHeartbeat", req))
    assert r.status_code == 401
    pull = PullMessagesRequest(node=Node(node_id=node))
    assert (
        link.send(build(capturing_client("fleet:443", key), "PullMessages", pull)).status_code
        == 401
    )
    time.sleep(1.0)  # two flush intervals: the heartbeat noted before the deletion is written
    assert _stored(db, node)[0] == "unregistered"  # and did not bring it back


def test_forged_signatures_and_other_nodes_keys_are_refused_and_not_noted(
    slow: tuple[Link, Path],
) -> None:
    link, _db = slow
    key, node = _device(link)
    other_key, _other = _device(link)
    link.ask(op="node", node=node)  # flushes whatever an earlier test left pending
    assert link.ask(op="pending")["pending"] == 0
    req = SendNodeHeartbeatRequest(node=Node(node_id=node), heartbeat_interval=INTERVAL)

    forged = build(capturing_client("fleet:443", key), "SendNodeHeartbeat", req)
    sig_name = next(k for k in forged.headers if "signature" in k.lower())
    sig = forged.headers[sig_name]
    forged.headers[sig_name] = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
    assert link.send(forged).status_code == 401
    other = build(capturing_client("fleet:443", other_key), "SendNodeHeartbeat", req)
    assert link.send(other).status_code == 401  # another node's key for this node id
    stranger = ec.generate_private_key(ec.SECP256R1())
    assert (
        link.send(build(capturing_client("fleet:443", stranger), "SendNodeHeartbeat", req))
    ).status_code == 401
    nan = SendNodeHeartbeatRequest(node=Node(node_id=node), heartbeat_interval=float("nan"))
    r = link.send(build(capturing_client("fleet:443", key), "SendNodeHeartbeat", nan))
    assert r.status_code != 200  # Flower's path refuses an interval out of its bounds
    assert link.ask(op="pending")["pending"] == 0  # none of them noted
