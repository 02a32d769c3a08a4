"""A misbehaving device for the deployment tests: a real SuperNode and worker whose
training replies are garbage (NaN update, wrong size, absurd example count, by round;
under secure aggregation a masked vector of the wrong length or out of range).

Usage: python garbage_client.py SERVER CLIENT_ID STATE_DIR CA KEY
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedveil.client.edge.device_app import EdgeClient, TaskSource
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.protocol.envelope import Envelope


class GarbageClient(EdgeClient):
    def handle(self, run_id: int, run_config: Mapping[str, Any], request: Envelope) -> Envelope:
        reply = super().handle(run_id, run_config, request)
        if request.kind == "secagg.masked_input":  # under secure aggregation
            vector = np.asarray(reply.arrays["sa.masked_vector"])
            if request.round % 2:
                reply.arrays["sa.masked_vector"] = vector[:-7]  # wrong length
            else:
                reply.arrays["sa.masked_vector"] = np.full_like(vector, np.iinfo(vector.dtype).max)
            return reply
        if request.kind != "train":
            return reply
        delta = torch.as_tensor(reply.arrays["delta"])
        kind = request.round % 3
        if kind == 1:
            reply.arrays["delta"] = torch.full_like(delta, float("nan"))
        elif kind == 2:
            reply.arrays["delta"] = torch.zeros(delta.numel() + 7)
        else:
            reply.config["num_examples"] = 10**12
        return reply


def main() -> int:
    server, cid, state, ca, key = sys.argv[1:6]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    opts = EdgeOptions(server, int(cid), Path(state), ca=Path(ca), key=Path(key))
    return EdgeNode(opts, GarbageClient(TaskSource("deploy_task:make"), int(cid))).run()


if __name__ == "__main__":
    sys.exit(main())
