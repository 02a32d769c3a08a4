"""tests/flower_quickstart_app.py's stock ClientApp with fedveil's secure aggregation:
the only change is the mod (and its import). Each client reports num-examples =
64 * (partition + 1), so weighting by it and weighting by 1 (DP) give different means.
"""

from __future__ import annotations

import flower_quickstart_app as quickstart
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedveil.flower import fedveil_secagg_mod

app = ClientApp(mods=[fedveil_secagg_mod])


def weight_of(partition_id: int) -> int:
    return 64 * (partition_id + 1)


@app.train()
def train(msg: Message, context: Context) -> Message:
    reply = quickstart.train(msg, context)
    partition = int(context.node_config["partition-id"])
    reply.content["metrics"]["num-examples"] = weight_of(partition)
    return reply


app.evaluate()(quickstart.evaluate)
