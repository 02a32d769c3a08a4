"""A device whose SuperNode gets one reply it did not wait for: the real SuperNode and
worker, except that the first message is answered twice, the second time 1.5 s later.

That extra reply stands in for the reply to a message whose download the SuperNode
gave up when the coordinator died (the worker had it already and answered it): a
reply the SuperNode's loop was not waiting for. Flower's own loop then sends every
later reply one pull late; the fixed one (client/supernode.py) sends it at once.

Usage: python late_reply_client.py SERVER CLIENT_ID STATE_DIR CA KEY
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import flwr.supernode.runtime.run_clientapp as runtime
from flwr.app import Error, Message

import fedveil.client.edge.edge as edge
from fedveil.client.edge.device_app import EdgeClient, TaskSource
from fedveil.client.edge.edge import EdgeNode, EdgeOptions

log = logging.getLogger("late-reply")
EXTRA_REPLY_DELAY_S = 1.5

first: dict[str, Any] = {}
flower_answer, flower_push = edge.answer, runtime.push_message


def answer(client: EdgeClient, message: Message, run_id: int, run_config: Any) -> Message:
    first.setdefault("message", message)
    return flower_answer(client, message, run_id, run_config)


def push_message(client: Any, reply: Message, context: Any) -> None:
    flower_push(client, reply, context)
    if "message" in first and not first.get("extra_sent"):
        first["extra_sent"] = True
        time.sleep(EXTRA_REPLY_DELAY_S)  # the SuperNode has sent the first reply meanwhile
        extra = Message(Error(4000, "a reply nobody waits for"), reply_to=first["message"])
        flower_push(client, extra, context)
        log.info("pushed an extra reply to message %s", first["message"].metadata.message_id)


def main() -> int:
    server, cid, state, ca, key = sys.argv[1:6]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    edge.answer = answer  # type: ignore[assignment]
    runtime.push_message = push_message  # type: ignore[assignment]
    opts = EdgeOptions(server, int(cid), Path(state), ca=Path(ca), key=Path(key))
    return EdgeNode(opts, EdgeClient(TaskSource("deploy_task:make"), int(cid))).run()


if __name__ == "__main__":
    sys.exit(main())
