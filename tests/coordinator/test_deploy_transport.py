"""DeployTransport's bookkeeping of who is who, over a scripted stand-in for the SuperLink
Grid (the real Grid is exercised end to end in test_deploy.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import pytest
from flwr.app import Error, Message
from flwr.supercore.task_identity import TaskIdentity

from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import from_content, to_content
from fedveil.server.coordinator.deploy_transport import DeployTransport
from fedveil.server.engine.transport import ClientFailure

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

Handler = Callable[[Envelope], Envelope | Error | None]


class ScriptedGrid:
    """Nodes answer at once with their handler's reply (None: never answer)."""

    def __init__(self, nodes: dict[int, Handler]) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.nodes = nodes
        self.online = set(nodes)
        self.outbox: dict[str, Message] = {}
        self.ids = itertools.count()
        self.seen: list[tuple[int, Envelope]] = []

    def get_node_ids(self) -> Iterable[int]:
        return sorted(self.online)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        out = []
        for msg in messages:
            msg_id = f"m{next(self.ids)}"
            msg.metadata.__dict__["_message_id"] = msg_id
            node = msg.metadata.dst_node_id
            env = from_content(msg.content)
            self.seen.append((node, env))
            reply_env = self.nodes[node](env)
            if reply_env is not None:
                body = reply_env if isinstance(reply_env, Error) else to_content(reply_env)
                reply = Message(body, reply_to=msg)
                reply.metadata.__dict__["_src_node_id"] = node
                self.outbox[msg_id] = reply
            out.append(msg_id)
        return out

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self.outbox.pop(m) for m in list(message_ids) if m in self.outbox]


def client(cid: int, size: int = 10, train: Handler | None = None) -> Handler:
    def handle(env: Envelope) -> Envelope | Error | None:
        if env.kind == "hello":
            return Envelope("hello", 0, {"client_id": cid, "size": size})
        return train(env) if train else Envelope("train", env.round, {"ok": cid})

    return handle


def transport(grid, enrolled=None, num_clients=4) -> DeployTransport:
    t = DeployTransport(
        grid,
        num_clients=num_clients,
        model_size=10,
        enrolled=enrolled,
        setup={"run_num_classes": 3},
        poll_s=0.01,
        liveness_s=0.01,
    )
    return t


def test_hellos_map_nodes_and_refuse_impostors_and_wrong_models():
    grid = ScriptedGrid(
        {
            101: client(0),
            102: client(1),
            103: client(1),  # claims client 1, but the key enrolled as client 2
            104: client(3, size=11),  # a model of another size
            105: client(9),  # outside the population
        }
    )
    t = transport(grid, enrolled={101: 0, 102: 1, 103: 2, 104: 3, 105: 9})
    assert t.wait_for(2, timeout_s=2) == 2
    t.refresh()
    assert t.node_of == {0: 101, 1: 102}
    assert all(env.config["run_num_classes"] == 3 for _, env in grid.seen)  # setup rides along
    # Without enrollment (no SuperNode auth) hellos are believed: the last claim wins.
    open_grid = ScriptedGrid({101: client(0), 102: client(1), 103: client(1)})
    t2 = transport(open_grid)
    t2.wait_for(2, timeout_s=2)
    assert set(t2.node_of) == {0, 1}


def test_exchange_failures_are_per_client():
    def silent(env: Envelope) -> None:
        return None

    grid = ScriptedGrid(
        {
            101: client(0),
            102: client(1, train=silent),
            103: client(2, train=lambda env: Envelope("train", env.round, {"x": 1})),
        }
    )
    t = transport(grid)
    t.wait_for(3, timeout_s=2)
    req = Envelope("train", 1, {"seed": 0})
    replies = t.exchange({0: req, 1: req, 2: req, 3: req}, timeout_s=0.3)
    assert isinstance(replies[0], Envelope) and replies[0].config["ok"] == 0
    assert isinstance(replies[1], ClientFailure) and "deadline" in replies[1].reason
    assert isinstance(replies[2], Envelope)
    assert isinstance(replies[3], ClientFailure) and replies[3].reason == "not connected"
    # A node that drops off the SuperLink mid-wait is given up on at once.
    grid.online.discard(102)
    replies = t.exchange({1: req}, timeout_s=None)
    assert isinstance(replies[1], ClientFailure) and replies[1].reason in (
        "went offline during the round",
        "not connected",
    )


def test_error_replies_become_failures():
    grid = ScriptedGrid({101: client(0, train=lambda env: Error(4001, "refused by local policy"))})
    t = transport(grid)
    t.wait_for(1, timeout_s=2)
    replies = t.exchange({0: Envelope("train", 1, {})}, timeout_s=1)
    assert isinstance(replies[0], ClientFailure) and "local policy" in replies[0].reason


def test_a_lost_hello_is_sent_again(monkeypatch):
    import fedveil.server.coordinator.deploy_transport as module

    monkeypatch.setattr(module, "HELLO_RETRY_S", 0.05)
    hellos = []

    def forgetful(env: Envelope) -> Envelope | Error | None:
        if env.kind == "hello":
            hellos.append(env)
            if len(hellos) == 1:
                return None  # the first hello is lost (e.g. the device restarted)
        return client(0)(env)

    grid = ScriptedGrid({101: forgetful})
    t = transport(grid)
    assert t.refresh() == 0
    assert t.wait_for(1, 5.0) == 1
    assert t.connected() == [0] and len(hellos) == 2


class OneBehindGrid(ScriptedGrid):
    """Node 101 answers each hello only when the next one arrives (as a device whose
    SuperNode is still stuck on a task of a run the coordinator forgot in a crash)."""

    def __init__(self) -> None:
        super().__init__({101: client(0)})
        self.held: tuple[str, Message] | None = None
        self.hellos = 0

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = super().push_messages(messages)
        for msg_id in ids:
            self.hellos += 1
            reply = self.outbox.pop(msg_id)
            if self.held is not None:
                held_id, held = self.held
                self.outbox[held_id] = held
            self.held = (msg_id, reply)
        return ids


def test_a_late_reply_to_an_earlier_hello_still_maps_the_node(monkeypatch):
    import fedveil.server.coordinator.deploy_transport as module

    monkeypatch.setattr(module, "HELLO_RETRY_S", 0.05)
    grid = OneBehindGrid()
    t = transport(grid)
    assert t.wait_for(1, 5.0) == 1
    assert t.connected() == [0] and grid.hellos == 2


def test_a_silent_node_keeps_only_its_last_hellos(monkeypatch):
    import fedveil.server.coordinator.deploy_transport as module

    monkeypatch.setattr(module, "HELLO_RETRY_S", 0.0)
    grid = ScriptedGrid({101: lambda env: None})
    t = transport(grid)
    for _ in range(20):
        t.refresh()
    assert len(grid.seen) == 20 and t.connected() == []
    assert len(t._hello_pending) == module.HELLOS_KEPT
