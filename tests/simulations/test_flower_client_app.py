"""The Flower ClientApp adapter, as Flower's simulation engine drives it."""

from __future__ import annotations

import time

import cloudpickle
import pytest
from flwr.app import Context, Message, Metadata, RecordDict

import tiny_task
from fedveil.client.flower_client_app import make_client_app
from fedveil.client.runtime import ClientRuntime
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.tasks import Task

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

BUILT: list[Task] = []


def counting_factory() -> ClientRuntime:
    """Module level, so cloudpickle sends it by reference and the count survives pickling."""
    task = tiny_task.make(load_config(None, {"model.task": "tiny_task:make"}))
    BUILT.append(task)
    return ClientRuntime(task)


def delivered(kind: str, node_id: int) -> Message:
    """A request as a SuperNode receives it (metadata filled in by the SuperLink)."""
    return Message(
        content=to_content(Envelope(kind, 1, {})),
        metadata=Metadata(
            run_id=1,
            message_id=f"m{node_id}",
            src_node_id=0,
            dst_node_id=node_id,
            reply_to_message_id="",
            group_id="",
            created_at=time.time(),
            ttl=60.0,
            message_type=message_type(kind),
        ),
    )


def test_the_runtime_is_built_once_per_process_though_the_app_is_pickled_per_message():
    # Ray ships the ClientApp to the worker with every message, so a cache kept in the
    # app itself would rebuild the task and model for each one.
    BUILT.clear()
    app = make_client_app(counting_factory)
    for client in range(3):
        shipped = cloudpickle.loads(cloudpickle.dumps(app))
        context = Context(1, client + 10, {"partition-id": client}, RecordDict(), {})
        reply = shipped(delivered("hello", client + 10), context)
        assert from_content(reply.content).config["client_id"] == client
    assert len(BUILT) == 1

    # A new app (a new run in a long-lived worker) gets its own runtime.
    other = cloudpickle.loads(cloudpickle.dumps(make_client_app(counting_factory)))
    other(delivered("hello", 99), Context(1, 99, {"partition-id": 0}, RecordDict(), {}))
    assert len(BUILT) == 2


def test_the_app_ships_no_function_code_with_each_message():
    # Flower's simulation pickles the ClientApp with every message: its handlers travel by
    # reference (instances of a module-level class), not as closures whose code cloudpickle
    # rebuilds by value at both ends of every message.
    raw = cloudpickle.dumps(make_client_app(counting_factory))
    assert b"_make_function" not in raw  # cloudpickle's rebuilder of a by-value function
    shipped = cloudpickle.loads(raw)
    context = Context(1, 12, {"partition-id": 2}, RecordDict(), {})
    assert from_content(shipped(delivered("hello", 12), context).content).config["client_id"] == 2


def nan_factory() -> ClientRuntime:
    """Clients whose features are all NaN: local training diverges."""
    return ClientRuntime(tiny_task.make_nan(load_config(None, {"model.task": "tiny_task:make"})))


def test_a_diverged_update_is_a_named_client_failure_without_a_traceback(caplog):
    # It was sent to the server as trained (NaN update and loss); with a clip, a traceback.
    from fedveil.flat_model import FlatModel
    from fedveil.protocol.kinds import ErrorCode

    cfg = load_config(None, {"model.task": "tiny_task:make"})
    model = FlatModel(tiny_task.make(cfg).model_fn()).get()
    hp = {"seed": 1, "local_epochs": 1, "local_steps": 0, "batch_size": 16, "lr": 0.1}
    hp |= {"momentum": 0.0, "weight_decay": 0.0, "prox_mu": 0.0}
    request = delivered("train", 10)
    request.content = to_content(Envelope("train", 1, hp, {"model": model}))
    context = Context(1, 10, {"partition-id": 0}, RecordDict(), {})
    with caplog.at_level("WARNING", logger="fedveil.client"):
        reply = make_client_app(nan_factory)(request, context)
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_FAILURE.value
    assert reply.error.reason.startswith("array 'delta' contains NaN or Inf")
    [record] = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert record.exc_info is None and "train request failed" in record.getMessage()
