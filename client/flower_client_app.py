"""Flower ClientApp adapter around ClientRuntime.

It answers fedveil's own message types (`query.hello`, `train.train`, ...) and, beside
them, a stock Flower server's `train` / `evaluate` (flwr.serverapp.strategy.FedAvg's
conventions, see flower_stock_server.py). The client's logical id is its `partition-id`
(Flower simulation) or the `client-id` given in the SuperNode's node config
(deployment). A bad server message is logged and answered with an error reply; it
never crashes the node.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp

from fedveil.client.flower_stock_server import STOCK_TYPES, StockRefused, answer_stock
from fedveil.client.runtime import ClientRuntime
from fedveil.client.trained_update import NonFiniteUpdate
from fedveil.protocol.envelope import MessageError
from fedveil.protocol.flower_codec import KINDS, from_content, message_type, to_content
from fedveil.protocol.kinds import ErrorCode

log = logging.getLogger("fedveil.client")

# Error codes in Flower error replies.
BAD_MESSAGE = ErrorCode.BAD_MESSAGE.value
CLIENT_FAILURE = ErrorCode.CLIENT_FAILURE.value


def client_id_of(context: Context) -> int:
    for key in ("client-id", "partition-id"):
        if key in context.node_config:
            return int(context.node_config[key])
    raise RuntimeError("node config has neither 'client-id' nor 'partition-id'")


STATE_CONFIG = "fedveil.state"
STATE_ARRAYS = "fedveil.arrays"


def load_state(context: Context) -> dict[str, Any]:
    """The runtime's state between messages (e.g. secure-aggregation keys of this round).

    Flower keeps a node's `context.state` between messages of a run, and it can
    hold only records, so the state is a flat dict of config values and arrays.
    Records are read and written by key: RecordDict's typed views rebuild a dict of
    every record on each access.
    """
    state: dict[str, Any] = {}
    config = context.state.get(STATE_CONFIG)
    if isinstance(config, ConfigRecord):
        state.update(config)
    arrays = context.state.get(STATE_ARRAYS)
    if isinstance(arrays, ArrayRecord):
        state.update({k: a.numpy() for k, a in arrays.items()})
    return state


def save_state(context: Context, state: dict[str, Any]) -> None:
    arrays = {k: v for k, v in state.items() if isinstance(v, (np.ndarray, torch.Tensor))}
    config = {k: v for k, v in state.items() if k not in arrays}
    context.state[STATE_CONFIG] = ConfigRecord(config)
    if arrays or STATE_ARRAYS in context.state:
        context.state[STATE_ARRAYS] = ArrayRecord(
            {
                k: Array(
                    np.ascontiguousarray(v.cpu().numpy() if isinstance(v, torch.Tensor) else v)
                )
                for k, v in arrays.items()
            }
        )


# The runtime of each process, under the token of the app that built it. Flower's
# simulation engine pickles the ClientApp with every message, so anything cached in the
# app itself would start empty each time (and rebuild the model per message).
_RUNTIMES: dict[str, ClientRuntime] = {}


def runtime_of_this_process(token: str, factory: Callable[[], ClientRuntime]) -> ClientRuntime:
    """Module level on purpose: cloudpickle sends a module function by reference, so the
    app's closure reaches this module's cache, not a pickled copy of it."""
    runtime = _RUNTIMES.get(token)
    if runtime is None:
        _RUNTIMES.clear()  # a process serves one app at a time: free an earlier run's model
        runtime = _RUNTIMES[token] = factory()
    return runtime


class _Handler:
    """The ClientApp's handler of fedveil's message types. A module-level class, not a
    closure: Flower's simulation pickles the ClientApp with every message, and
    cloudpickle sends a closure's code by value (about 0.3 ms of CPU a message, both ends)
    but an instance of a module-level class by reference (its token and factory only)."""

    def __init__(self, token: str, runtime_factory: Callable[[], ClientRuntime]) -> None:
        self.token = token
        self.runtime_factory = runtime_factory

    def __call__(self, msg: Message, context: Context) -> Message:
        runtime = runtime_of_this_process(self.token, self.runtime_factory)
        cid = client_id_of(context)
        state = load_state(context)
        try:
            request = from_content(msg.content)
            reply = runtime.handle(cid, request, state)
            save_state(context, state)
        except MessageError as exc:
            log.warning("client %d: bad message from server dropped: %s", cid, exc)
            return Message(Error(BAD_MESSAGE, str(exc)), reply_to=msg)
        except NonFiniteUpdate as exc:  # its data or model diverged: no traceback
            return _diverged(cid, msg, exc)
        except Exception as exc:
            log.exception("client %d: failed to handle %s", cid, msg.metadata.message_type)
            return Message(Error(CLIENT_FAILURE, f"{type(exc).__name__}: {exc}"), reply_to=msg)
        return Message(to_content(reply), reply_to=msg)


class _StockHandler(_Handler):
    """The ClientApp's handler of a stock Flower server's `train` / `evaluate`."""

    def __call__(self, msg: Message, context: Context) -> Message:
        runtime = runtime_of_this_process(self.token, self.runtime_factory)
        cid = client_id_of(context)
        mtype = msg.metadata.message_type
        try:
            content = answer_stock(runtime, cid, mtype, msg.content)
        except StockRefused as exc:
            log.warning("client %d: stock %s message refused: %s", cid, mtype, exc)
            return Message(Error(BAD_MESSAGE, str(exc)), reply_to=msg)
        except MessageError as exc:
            log.warning("client %d: bad stock %s message dropped: %s", cid, mtype, exc)
            return Message(Error(BAD_MESSAGE, str(exc)), reply_to=msg)
        except NonFiniteUpdate as exc:
            return _diverged(cid, msg, exc)
        except Exception as exc:
            log.exception("client %d: failed to handle stock %s", cid, mtype)
            return Message(Error(CLIENT_FAILURE, f"{type(exc).__name__}: {exc}"), reply_to=msg)
        return Message(content, reply_to=msg)


def _diverged(cid: int, msg: Message, exc: NonFiniteUpdate) -> Message:
    """A client failure named in one log line: the update was refused, never sent."""
    log.warning("client %d: %s request failed: %s", cid, msg.metadata.message_type, exc)
    return Message(Error(CLIENT_FAILURE, str(exc)), reply_to=msg)


def make_client_app(runtime_factory: Callable[[], ClientRuntime]) -> ClientApp:
    """A ClientApp; `runtime_factory` runs once per process (loads data, builds the model)."""
    app = ClientApp()
    token = secrets.token_hex(16)
    handle = _Handler(token, runtime_factory)
    handle_stock = _StockHandler(token, runtime_factory)
    for kind in KINDS:
        category, action = message_type(kind).split(".")
        getattr(app, category)(action)(handle)
    # A stock server's types carry no action: Flower dispatches them to 'default'.
    for category in STOCK_TYPES:
        getattr(app, category)()(handle_stock)
    return app
