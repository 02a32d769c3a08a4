"""A device slow to unmask: the real SuperNode and worker, except that it holds its reply
to every secure-aggregation unmask request for SLOW_UNMASK_S seconds (a phone whose
shares come late) and logs HOLDING when it starts to.

Usage: python slow_unmask_client.py SERVER CLIENT_ID STATE_DIR CA KEY
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import Message

import fedveil.client.edge.edge as edge
from fedveil.client.edge.device_app import EdgeClient, TaskSource
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.protocol.flower_codec import message_type
from fedveil.protocol.kinds import Kind, Stage

log = logging.getLogger("slow-unmask")
# Far longer than a group's round takes on a loaded machine (25 s seen at load 15): a
# group that waited for these shares could not finish before it; the test stops the device.
SLOW_UNMASK_S = 300.0
HOLDING = "holding its unmask reply"
UNMASK = message_type(Kind.secagg(Stage.UNMASK))

flower_answer = edge.answer


def answer(client: EdgeClient, message: Message, run_id: int, run_config: Any) -> Message:
    if message.metadata.message_type == UNMASK:
        log.info("%s for %.0f s", HOLDING, SLOW_UNMASK_S)
        time.sleep(SLOW_UNMASK_S)
    return flower_answer(client, message, run_id, run_config)


def main() -> int:
    server, cid, state, ca, key = sys.argv[1:6]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    edge.answer = answer  # type: ignore[assignment]
    opts = EdgeOptions(server, int(cid), Path(state), ca=Path(ca), key=Path(key))
    return EdgeNode(opts, EdgeClient(TaskSource("deploy_task:make"), int(cid))).run()


if __name__ == "__main__":
    sys.exit(main())
