"""fedveil's client under a stock Flower server: Flower's Message-API conventions.

A stock `flwr.serverapp.strategy.FedAvg` (and Flower's quickstart ServerApps) sends
`train` and `evaluate` messages, dispatched to a ClientApp's `@app.train()` /
`@app.evaluate()`. Each carries the model's `state_dict()` (buffers included, in its
order) as the ArrayRecord "arrays" and a ConfigRecord "config" with "server-round" plus
whatever train config the strategy was given ("lr", ...). A train reply carries the
trained "arrays" and a MetricRecord "metrics" with "num-examples" and "train_loss"; an
evaluate reply carries "metrics" with "num-examples", "eval_loss" and "eval_acc".

Here such a message becomes the Envelope fedveil's own server would have sent, so the
same ClientRuntime trains and evaluates: training settings the server gives under their
config names (`lr`, `local_epochs` or `local-epochs`, ...) are used, the rest come from
the client's own run config. A client whose run needs secure aggregation refuses a
stock train message: its update would leave in the clear. Under distributed DP it
refuses a stock evaluate message too (ClientRuntime): its accuracy and loss would reach
the server un-noised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedveil.client.runtime import ClientRuntime
from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.flower_codec import (
    STOCK_ARRAYS,
    STOCK_CONFIG,
    STOCK_EVALUATE,
    STOCK_METRICS,
    STOCK_NUM_EXAMPLES,
    STOCK_SERVER_ROUND,
    STOCK_TRAIN,
    numpy_of,
)
from fedveil.protocol.kinds import Kind

# Message types of a stock server's requests (fedveil's own are "<category>.<kind>").
STOCK_TYPES = (STOCK_TRAIN, STOCK_EVALUATE)
# Metric names of the replies, as Flower's quickstart ClientApps report them.
TRAIN_LOSS = "train_loss"
EVAL_LOSS = "eval_loss"
EVAL_ACCURACY = "eval_acc"


class StockRefused(MessageError):
    """A stock request this client will not answer (its run needs fedveil's protocol)."""


def is_stock_type(message_type: str) -> bool:
    return message_type in STOCK_TYPES


def clear_update_refusal(cfg: RunConfig | None) -> str | None:
    """Why this client must not send its update in the clear to a stock server (None: it may)."""
    if cfg is None:
        return None
    if cfg.secagg.enabled or cfg.dp.mechanism == "distributed":
        setting = (
            "secagg.enabled = true"
            if cfg.secagg.enabled
            else "dp.mechanism = 'distributed' (secure aggregation)"
        )
        return (
            f"this client's run needs secure aggregation ({setting}); a stock Flower "
            "train message would take its update in the clear, so it is refused. Run "
            "fedveil's ServerApp (fedveil.flower:server), or turn secure aggregation off"
        )
    return None


def training_defaults(cfg: RunConfig | None) -> dict[str, Any]:
    """The training request's config as this client's run config sets it."""
    cfg = cfg or RunConfig()
    c = cfg.client
    values: dict[str, Any] = {key: getattr(c, key) for key, _ in F.HYPERPARAMETERS}
    values[F.SEED] = cfg.seed
    if c.dp_sgd_noise > 0:  # the client's own sample-level DP stays on under any server
        values[F.DP_SGD_NOISE] = c.dp_sgd_noise
        values[F.DP_SGD_CLIP] = c.dp_sgd_clip
    return values


def stock_request(
    kind: Kind, content: RecordDict, layout: FlatModel, defaults: Mapping[str, Any]
) -> Envelope:
    """The Envelope fedveil's server would have sent for a stock `train`/`evaluate`
    content; MessageError names what the content lacks or gets wrong."""
    arrays = content.get(STOCK_ARRAYS)
    if not isinstance(arrays, ArrayRecord):
        raise MessageError(
            f"stock {kind} message lacks the ArrayRecord {STOCK_ARRAYS!r} (the model's "
            "state_dict, as flwr.serverapp.strategy.FedAvg sends it)"
        )
    config = content.get(STOCK_CONFIG)
    if config is None:
        config = ConfigRecord()
    if not isinstance(config, ConfigRecord):
        raise MessageError(f"stock {kind} message: {STOCK_CONFIG!r} is not a ConfigRecord")
    rnd = config.get(STOCK_SERVER_ROUND, 0)
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        raise MessageError(f"stock {kind} message: {STOCK_SERVER_ROUND} = {rnd!r}: an integer >= 0")
    tensors = {k: torch.from_numpy(numpy_of(k, a)) for k, a in arrays.items()}
    try:
        vector = layout.vector_from(tensors)
    except ValueError as exc:
        raise MessageError(f"stock {kind} message's {STOCK_ARRAYS!r}: {exc}") from None
    values = dict(defaults)
    for key, _ in F.HYPERPARAMETERS:
        for name in (key, key.replace("_", "-")):
            if name in config:
                values[key] = config[name]
    return Envelope(kind, rnd, values, {F.MODEL: vector.numpy()})


def stock_reply(request: Envelope, reply: Envelope, layout: FlatModel) -> RecordDict:
    """A stock server's view of `reply`: trained arrays and metrics for train, metrics
    for evaluate."""
    n = int(reply.config[F.NUM_EXAMPLES])
    if request.kind == Kind.EVALUATE:
        metrics = MetricRecord(
            {
                STOCK_NUM_EXAMPLES: n,
                EVAL_LOSS: float(reply.config[F.LOSS]),
                EVAL_ACCURACY: float(reply.config[F.ACCURACY]),
            }
        )
        return RecordDict({STOCK_METRICS: metrics})
    sent = torch.from_numpy(request.arrays[F.MODEL]).to(layout.device)
    delta = reply.arrays[F.DELTA]
    delta = torch.as_tensor(delta).to(layout.device, torch.float32)
    layout.set(sent + delta)
    # The whole state_dict in its order: integer buffers (BatchNorm's count) as they are.
    state = {k: v.detach().cpu().clone() for k, v in layout.module.state_dict().items()}
    metrics = MetricRecord({STOCK_NUM_EXAMPLES: n, TRAIN_LOSS: float(reply.config[F.LOSS])})
    return RecordDict({STOCK_ARRAYS: ArrayRecord(state), STOCK_METRICS: metrics})


def answer_stock(
    runtime: ClientRuntime, client_id: int, message_type: str, content: RecordDict
) -> RecordDict:
    """The reply content to a stock server's `train` or `evaluate` message."""
    kind = Kind.TRAIN if message_type == STOCK_TRAIN else Kind.EVALUATE
    if kind == Kind.TRAIN:
        refusal = clear_update_refusal(runtime.run_config)
        if refusal is not None:
            raise StockRefused(refusal)
    request = stock_request(kind, content, runtime.model, training_defaults(runtime.run_config))
    reply = runtime.handle_one(client_id, request, {})
    return stock_reply(request, reply, runtime.model)
