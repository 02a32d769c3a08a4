"""Issue 33: idle polls answered from memory (server/coordinator/idle_polls.py).

A SuperLink process (idle_link_child.py: Flower's app on an SQLite file, fedveil's
Fleet listener on a loopback port, as `fedveil server`'s SuperLink child serves it)
and devices whose every request is built and signed by Flower's own SuperNode client
code (benchmarks/fleet_wire.py) with real P-256 keys. Messages are pushed through
Flower's Grid in that process, the write path a ServerApp's push takes into the state.
What must hold:

- a quiet node's PullMessages is answered from memory (counted), with the answer
  Flower's own path gives for an empty pull;
- a message pushed after such an idle poll is delivered on the next poll;
- a message whose TTL has passed is not delivered (and its node is quiet again);
- an unknown key, a node id not the key's, and a bad signature are still refused 401,
  also for a quiet node, and are never answered from memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.proto.fleet_pb2 import ActivateNodeRequest, PullMessagesRequest, PullMessagesResponse
from flwr.proto.node_pb2 import Node

from fedveil.benchmarks.fleet_wire import build, capturing_client

pytestmark = pytest.mark.procs  # starts a SuperLink process


class Link:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.port = int(self._read()["port"])
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the SuperLink process exited"
        return dict(json.loads(line))

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def idle(self) -> int:
        return int(self.ask(op="idle")["idle"])

    def send(self, request: httpx.Request) -> httpx.Response:
        """Flower's signed request, as built, to this process's Fleet port."""
        return self.http.post(request.url.path, content=request.content, headers=request.headers)


@pytest.fixture(scope="module")
def link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Link]:
    state = tmp_path_factory.mktemp("idle-link")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("idle_link_child.py")), str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        link = Link(proc)
        yield link
        link.http.close()
    finally:
        proc.kill()
        proc.wait(10)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _device(link: Link) -> tuple[ec.EllipticCurvePrivateKey, int]:
    """A registered (Control API) and activated (Fleet) device: its key and node id."""
    key = ec.generate_private_key(ec.SECP256R1())
    node = int(link.ask(op="register", pem=_pem(key).decode())["node"])
    req = ActivateNodeRequest(public_key=_pem(key), heartbeat_interval=30.0)
    r = link.send(build(capturing_client("fleet:443", key), "ActivateNode", req))
    assert r.status_code == 200, r.text
    return key, node


def _pull(link: Link, key: ec.EllipticCurvePrivateKey, node: int) -> httpx.Response:
    req = PullMessagesRequest(node=Node(node_id=node))
    return link.send(build(capturing_client("fleet:443", key), "PullMessages", req))


def _messages(r: httpx.Response) -> list[Any]:
    assert r.status_code == 200, r.text
    res = PullMessagesResponse()
    res.ParseFromString(r.content)
    return list(res.messages_list)


def test_idle_poll_then_push_is_delivered_on_the_next_poll(link: Link) -> None:
    key, node = _device(link)
    before = link.idle()
    idle = _pull(link, key, node)
    assert _messages(idle) == []
    assert link.idle() == before + 1  # answered from memory

    ids = link.ask(op="push", node=node, ttl=600.0)["ids"]
    assert ids and ids[0]
    delivered = _messages(_pull(link, key, node))
    assert [m.metadata.message_id for m in delivered] == ids
    assert link.idle() == before + 1  # the node was busy: Flower's path delivered it

    # Delivered already, so nothing more: Flower's own empty answer (the index errs
    # towards "busy" until the TTL ends), which is what the memory answer looked like.
    flower_empty = _pull(link, key, node)
    assert _messages(flower_empty) == []
    assert link.idle() == before + 1
    assert flower_empty.content == idle.content
    assert flower_empty.headers["content-type"] == idle.headers["content-type"]


def test_an_expired_message_is_not_delivered(link: Link) -> None:
    key, node = _device(link)
    link.ask(op="push", node=node, ttl=1.0)
    time.sleep(1.5)
    before = link.idle()
    assert _messages(_pull(link, key, node)) == []
    assert link.idle() == before + 1  # quiet again once the TTL passed


def test_unknown_keys_wrong_nodes_and_bad_signatures_are_refused_for_quiet_nodes(
    link: Link,
) -> None:
    key, node = _device(link)
    other_key, other_node = _device(link)
    stranger = ec.generate_private_key(ec.SECP256R1())
    assert _messages(_pull(link, key, node)) == []  # quiet: the memory answer applies
    before = link.idle()

    assert _pull(link, stranger, node).status_code == 401  # a key nobody registered
    assert _pull(link, other_key, node).status_code == 401  # another node's key
    forged = build(
        capturing_client("fleet:443", key),
        "PullMessages",
        PullMessagesRequest(node=Node(node_id=node)),
    )
    sig_name = next(k for k in forged.headers if "signature" in k.lower())
    sig = forged.headers[sig_name]
    forged.headers[sig_name] = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
    assert link.send(forged).status_code == 401
    assert link.idle() == before  # none of them answered from memory
    assert _messages(_pull(link, other_key, other_node)) == []
