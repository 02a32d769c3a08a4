"""A device gives a task up as soon as its SuperNode gives the task's message up, not
after the worker's stall limit (client/edge/supernode.py forget_given_up, edge.pull_message).

The coordinator killed while a device downloads a message: when the restarted SuperLink
answers the SuperNode's next object pull that the run is no longer running, Flower's
SuperNode loop stops the download but leaves the message in its state, its objects
registered and never filled. The worker, polling those objects through the Runtime API,
waited for its 60 s stall limit while the resumed round waited for it.

In process, with Flower's own pieces: its SuperNode loop step (`_pull_and_store_message`,
wrapped as `fedveil client` runs it), its node state and object store, its Runtime API
handlers for the worker's calls, and the worker's own `pull_message`. The SuperLink's
answer is what Flower's retry invoker raises on it: `RunNotRunningException`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.supercore.constant import TaskType
from flwr.supercore.inflatable.inflatable_object import get_object_tree
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run, RunNotRunningException
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode import start_client_internal as loop
from flwr.supernode.nodestate import NodeStateFactory
from flwr.supernode.servicer.runtime import runtime_handlers

from fedveil.client.edge.edge import TaskPullAbandoned, pull_message
from fedveil.client.edge.supernode import Outbox, reply_driven

RUN_ID, NODE_ID = 77, 5
STALL_S = 60.0  # the worker's silence limit, as the device runs it


class RuntimeApi:
    """The worker's Runtime API calls, answered by the SuperNode's own handlers."""

    def __init__(self, state: Any, task: Any) -> None:
        self.state, self.task = state, task

    def __getattr__(self, rpc: str) -> Any:
        handler = getattr(runtime_handlers, _snake(rpc))
        return lambda request: handler(request, self.state, self.task)


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def a_message(monkeypatch: pytest.MonkeyPatch) -> tuple[Message, Any]:
    """A coordinator's message as the SuperNode receives it: metadata and object tree."""
    for name, value in (("_run_id", RUN_ID), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)  # the ServerApp that sends it
    content = RecordDict({"model": ArrayRecord([np.ones((64, 8), dtype=np.float32)])})
    message = Message(content, dst_node_id=NODE_ID, message_type="train")
    message.metadata.__dict__["_message_id"] = message.object_id
    return message, get_object_tree(message)


def downloading_supernode(
    monkeypatch: pytest.MonkeyPatch, pull_object: Any
) -> tuple[Any, threading.Thread]:
    """A node state with the run, and Flower's SuperNode loop step (wrapped as
    `fedveil client` runs it) downloading a coordinator's message through `pull_object`,
    in a thread: (state, thread)."""
    state = NodeStateFactory(ObjectStoreFactory()).state()
    state.set_node_id(NODE_ID)
    state.store_run(Run.create_empty(RUN_ID))
    message, tree = a_message(monkeypatch)
    pull, _ = reply_driven(loop._pull_and_store_message, loop._push_messages, Outbox())
    kwargs = {
        "state": state,
        "object_store": state.object_store,
        "node_config": {},
        "receive": lambda: (message, tree),
        "get_run": lambda run_id: pytest.fail("the run is known"),
        "get_fab": lambda fab_hash, run_id: pytest.fail("the run is known"),
        "pull_object": pull_object,
        "confirm_message_received": lambda run_id, object_id: None,
        "trusted_entities": None,
    }
    supernode = threading.Thread(target=pull, kwargs=kwargs, daemon=True)
    supernode.start()
    return state, supernode


def claimed_task(state: Any) -> Any:
    """The task the SuperNode made for the message, claimed as the worker claims it."""
    claimed = runtime_handlers.acquire_task(
        AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]), state
    )
    assert claimed.token, "the SuperNode offered no task"
    return claimed.task


def test_the_worker_gives_up_a_message_whose_run_stopped_mid_download(monkeypatch):
    downloading, superlink_answers = threading.Event(), threading.Event()

    def pull_object(run_id: int, object_id: str) -> bytes:
        downloading.set()
        superlink_answers.wait(30)
        raise RunNotRunningException  # the restarted SuperLink: the run is not running

    state, supernode = downloading_supernode(monkeypatch, pull_object)
    assert downloading.wait(30), "the SuperNode never started the download"

    # The worker claims the task the SuperNode made and waits for the message's objects.
    task = claimed_task(state)
    context = Context(RUN_ID, NODE_ID, {}, RecordDict(), {})
    outcome: dict[str, Any] = {}
    deadline = time.monotonic() + 20  # the old worker stops here, not after STALL_S

    def worker() -> None:
        try:
            outcome["message"] = pull_message(
                RuntimeApi(state, task),
                context,
                STALL_S,
                lambda: time.monotonic() > deadline,
            )
        except TaskPullAbandoned as exc:
            outcome["abandoned"] = (str(exc), time.monotonic())

    pulling = threading.Thread(target=worker, daemon=True)
    pulling.start()
    time.sleep(1.0)  # the worker is polling objects that are not there yet
    assert pulling.is_alive() and not outcome
    superlink_answers.set()
    answered = time.monotonic()
    supernode.join(10)
    assert not supernode.is_alive()
    pulling.join(30)

    assert "message" not in outcome
    reason, at = outcome["abandoned"]
    assert "gave the message up" in reason, reason
    # Within the worker's retry backoff (2 s), far from the stall limit.
    assert at - answered < 6.0, f"gave up {at - answered:.1f} s after the SuperLink's answer"
    # And the message is gone: a later task of the run finds nothing to answer.
    assert not state.get_messages_legacy(run_ids=[RUN_ID], is_reply=False)


def test_a_download_that_goes_silent_is_given_up_after_the_devices_stall_limit(monkeypatch):
    # The limit is the device's option (EdgeOptions.task_pull_stall_s,
    # --download-stall-seconds); here 1 s, against a coordinator that never answers.
    downloading, released = threading.Event(), threading.Event()

    def silent(run_id: int, object_id: str) -> bytes:
        downloading.set()
        released.wait(60)  # the link went silent
        raise RunNotRunningException

    state, supernode = downloading_supernode(monkeypatch, silent)
    try:
        assert downloading.wait(30), "the SuperNode never started the download"
        task = claimed_task(state)
        context = Context(RUN_ID, NODE_ID, {}, RecordDict(), {})
        start = time.monotonic()
        with pytest.raises(TaskPullAbandoned, match=r"^no part of the message arrived for 1 s$"):
            pull_message(RuntimeApi(state, task), context, 1.0, lambda: False)
        took = time.monotonic() - start
        assert 1.0 <= took < 20.0, f"gave up after {took:.1f} s"
    finally:
        released.set()
        supernode.join(10)
