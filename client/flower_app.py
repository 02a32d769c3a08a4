"""Flower ClientApp adapter around ClientRuntime.

The client's logical id is its `partition-id` (Flower simulation) or the
`client-id` given in the SuperNode's node config (deployment). A bad server
message is logged and answered with an error reply; it never crashes the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp

from fedveil.envelope import MessageError
from fedveil.flower_codec import KINDS, from_content, message_type, to_content

from .runtime import ClientRuntime

log = logging.getLogger("fedveil.client")

# Error codes in Flower error replies.
BAD_MESSAGE = 4001
CLIENT_FAILURE = 4002


def client_id_of(context: Context) -> int:
    for key in ("client-id", "partition-id"):
        if key in context.node_config:
            return int(context.node_config[key])
    raise RuntimeError("node config has neither 'client-id' nor 'partition-id'")


def make_client_app(runtime_factory: Callable[[], ClientRuntime]) -> ClientApp:
    """A ClientApp; `runtime_factory` runs once per process (loads data, builds the model)."""
    app = ClientApp()
    cache: dict[str, ClientRuntime] = {}

    def handle(msg: Message, context: Context) -> Message:
        if "runtime" not in cache:
            cache["runtime"] = runtime_factory()
        runtime = cache["runtime"]
        cid = client_id_of(context)
        state: dict[str, Any] = {}
        try:
            request = from_content(msg.content)
            reply = runtime.handle(cid, request, state)
        except MessageError as exc:
            log.warning("client %d: bad message from server dropped: %s", cid, exc)
            return Message(Error(BAD_MESSAGE, str(exc)), reply_to=msg)
        except Exception as exc:
            log.exception("client %d: failed to handle %s", cid, msg.metadata.message_type)
            return Message(Error(CLIENT_FAILURE, f"{type(exc).__name__}: {exc}"), reply_to=msg)
        return Message(to_content(reply), reply_to=msg)

    for kind in KINDS:
        category, action = message_type(kind).split(".")
        getattr(app, category)(action)(handle)
    return app
