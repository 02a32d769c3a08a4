"""Stock Flower ClientApps in a fedveil run: Flower's Message-API conventions.

A stock client (an `@app.train()` / `@app.evaluate()` app written as in Flower's
quickstart) knows nothing of fedveil's envelope. The server speaks to it as a stock
`flwr.serverapp.strategy.FedAvg` does: a `train` message with the model's `state_dict()`
as the ArrayRecord "arrays" and a ConfigRecord "config" ("server-round" plus fedveil's
training settings under their config names, which the client may ignore); the reply
carries the trained "arrays" and a MetricRecord "metrics" with "num-examples".

`StockCodec` turns such a reply into the envelope a fedveil client would have sent: the
update is reply minus sent. The round engine then treats it like any other: under central
DP the PlainChannel re-clips it to C and gives it weight 1, whatever it reports.

A stock client cannot take part in fedveil's own protocol (secure aggregation,
distributed DP, local DP-SGD): `protocol_needs` names what a run needs, and such a run
refuses stock clients at once. Legacy apps (`client_fn` / NumPyClient) are refused too:
they do not speak the Message API at all.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.privacy.dp.clipping import l2_norm
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

log = logging.getLogger("fedveil.flower")

MIGRATION_GUIDE = "https://flower.ai/docs/framework/how-to-upgrade-to-message-api.html"

# How each kind of node answers fedveil's first message (`query.hello`), in the reason of
# its error reply: a Message-API app has no query function of that name; a legacy app's
# message handler knows only the legacy message types.
STOCK_HELLO_ERROR = "No query function registered"
LEGACY_HELLO_ERROR = "Invalid message type"

# Metric names stock apps use for their losses and accuracies (Flower's quickstarts first).
TRAIN_LOSS_KEYS = ("train_loss", "train-loss", "loss")
EVAL_LOSS_KEYS = ("eval_loss", "eval-loss", "loss")
EVAL_ACCURACY_KEYS = ("eval_acc", "eval-acc", "eval_accuracy", "accuracy", "acc")


def node_kind_of(reason: str) -> str | None:
    """'stock' or 'legacy' from a node's error reply to `query.hello`; None: neither."""
    if STOCK_HELLO_ERROR in reason:
        return "stock"
    if LEGACY_HELLO_ERROR in reason:
        return "legacy"
    return None


def error_essence(reason: str, limit: int = 300) -> str:
    """The cause in a Flower error reply's reason, without the wrapping the simulation
    engine adds (exception classes, Ray's actor and process ids): replies from different
    processes with the same cause then read the same, and count as one reason."""
    if not reason.startswith("<class '"):  # not wrapped by Flower: the client's own words
        return reason[:limit]
    text = " ".join(reason.split())
    for marker in ("occurred. Message:", "Message:"):
        if marker in text:  # Ray's wrapping: the ClientApp's own message comes last
            text = text.rsplit(marker, 1)[1].strip().removesuffix("'>")
            break
    else:
        wrapped = _CLASS_AND_MESSAGE.fullmatch(text)  # "<class 'm.E'>:<'message'>"
        if wrapped:
            text = f"{wrapped[1].rsplit('.', 1)[-1]}: {wrapped[2]}"
    return (text or reason)[:limit]


_CLASS_AND_MESSAGE = re.compile(r"<class '([^']+)'>:<'(.*)'>")


def protocol_needs(cfg: RunConfig) -> str | None:
    """What of fedveil's own protocol this run needs from every client (None: nothing, so
    stock Flower clients may take part)."""
    needs = []
    if cfg.secagg.enabled or cfg.dp.mechanism == "distributed":
        needs.append("secure aggregation (secagg.enabled = true)")
    if cfg.dp.mechanism == "distributed":
        needs.append("distributed DP's client noise (dp.mechanism = 'distributed')")
    if cfg.client.dp_sgd_noise > 0:
        needs.append(f"local DP-SGD (client.dp_sgd_noise = {cfg.client.dp_sgd_noise:g})")
    return " and ".join(needs) or None


def stock_refusal(stock: int, total: int, needs: str) -> str:
    return (
        f"{stock} of {total} Flower nodes run a stock ClientApp (no fedveil protocol: it "
        f"answers only Flower's plain train/evaluate messages); this run needs {needs}, "
        "which a stock client lacks. Run fedveil's ClientApp (fedveil.flower:client) on "
        "every node, or turn those settings off"
    )


def legacy_refusal(legacy: int, total: int) -> str:
    return (
        f"{legacy} of {total} Flower nodes run a legacy ClientApp (client_fn / NumPyClient): "
        "it answered fedveil's first message with 'Invalid message type'. fedveil speaks "
        "Flower's Message API only: port the app to @app.train() / @app.evaluate() "
        f"(Flower's migration guide: {MIGRATION_GUIDE})"
    )


class StockCodec:
    """Envelopes <-> a stock Flower client's messages, for one model architecture.

    `module`: the task's model (any weights: they are overwritten before each message).
    Its state_dict's keys and shapes are what a stock client must send back.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.layout = FlatModel(module, "cpu")
        self._float_names = {e.name for e in self.layout.entries}
        self._state_names = set(self.layout.module.state_dict())
        self._sent: tuple[int, torch.Tensor, ArrayRecord] | None = None
        self._warned_loss = False

    # -- requests -------------------------------------------------------------------
    def request(self, env: Envelope) -> tuple[RecordDict, str]:
        """(content, Flower message type) of a train or evaluate request."""
        if env.kind not in (Kind.TRAIN, Kind.EVALUATE):
            raise MessageError(f"a stock Flower client cannot answer a {env.kind!r} message")
        config = ConfigRecord({STOCK_SERVER_ROUND: env.round, **env.config})
        content = RecordDict({STOCK_ARRAYS: self._arrays(env), STOCK_CONFIG: config})
        return content, STOCK_TRAIN if env.kind == Kind.TRAIN else STOCK_EVALUATE

    def _arrays(self, env: Envelope) -> ArrayRecord:
        """The model as a state_dict (buffers included, in its order); built once for
        the many clients of a round, who all get the same request."""
        weights = _vector(env)
        if self._sent is not None and self._sent[0] == id(env) and self._sent[1] is weights:
            return self._sent[2]
        self.layout.set(weights.detach().to("cpu", torch.float32))
        state = {k: v.detach().clone() for k, v in self.layout.module.state_dict().items()}
        record = ArrayRecord(state)
        self._sent = (id(env), weights, record)
        return record

    # -- replies --------------------------------------------------------------------
    def reply(self, request: Envelope, content: RecordDict) -> Envelope:
        """The envelope a fedveil client would have sent for `content`; MessageError
        names what the reply lacks."""
        metrics = _record(content, STOCK_METRICS, MetricRecord)
        n = _num_examples(metrics)
        if request.kind == Kind.EVALUATE:
            return Envelope(
                Kind.EVALUATE,
                request.round,
                {
                    F.NUM_EXAMPLES: n,
                    F.LOSS: _metric(metrics, EVAL_LOSS_KEYS, "an evaluation loss"),
                    F.ACCURACY: _metric(metrics, EVAL_ACCURACY_KEYS, "an accuracy"),
                },
            )
        arrays = _record(content, STOCK_ARRAYS, ArrayRecord)
        extra = sorted(set(arrays) - self._state_names)
        if extra:
            raise MessageError(
                f"reply's ArrayRecord {STOCK_ARRAYS!r}: array {extra[0][:60]!r} is not in the model"
            )
        # The float weights only: the state_dict's other entries (BatchNorm's step count)
        # are sent and may come back, but are no part of the update.
        tensors = {
            k: _weights(k, numpy_of(k, a)) for k, a in arrays.items() if k in self._float_names
        }
        try:
            trained = self.layout.vector_from(tensors)
        except ValueError as exc:
            raise MessageError(f"reply's ArrayRecord {STOCK_ARRAYS!r}: {exc}") from None
        delta = trained - _vector(request).detach().to("cpu", torch.float32)
        config: dict = {F.NUM_EXAMPLES: n, F.LOSS: self._train_loss(metrics)}
        clip = float(request.config.get(F.CLIP_NORM, 0.0) or 0.0)
        if request.config.get(F.CLIP_INDICATOR) and clip > 0:
            # Adaptive clipping's count: the server sees this update, so it answers for it.
            config[F.UNCLIPPED] = int(l2_norm(delta) <= clip)
        return Envelope(Kind.TRAIN, request.round, config, {F.DELTA: delta})

    def _train_loss(self, metrics: MetricRecord) -> float:
        for key in TRAIN_LOSS_KEYS:
            if key in metrics:
                return _finite(metrics, key)
        if not self._warned_loss:
            self._warned_loss = True
            log.warning(
                "a stock Flower client reports no training loss (metrics %s): its loss "
                "counts as 0 in the round's train_loss",
                "/".join(TRAIN_LOSS_KEYS),
            )
        return 0.0


def _weights(key: str, array: np.ndarray) -> torch.Tensor:
    """A stock client's returned weights as float32; MessageError for a dtype that is not
    a real float (strings, complex, integers, booleans: nothing a model's weights are)."""
    if array.dtype.kind != "f":
        raise MessageError(
            f"reply's array {key[:60]!r} has dtype {array.dtype}: a model's weights are "
            "real floating-point numbers"
        )
    # astype: any byte order and float width to native float32 (torch takes neither).
    return torch.from_numpy(array.astype(np.float32, copy=False))


def _vector(env: Envelope) -> torch.Tensor:
    weights = env.arrays.get(F.MODEL)
    if not isinstance(weights, torch.Tensor):
        raise MessageError(f"{env.kind} request carries no model tensor {F.MODEL!r}")
    return weights


def _record(content: RecordDict, name: str, kind: type) -> object:
    record = content.get(name)
    if not isinstance(record, kind):
        raise MessageError(
            f"stock client's reply lacks the {kind.__name__} {name!r} (Flower's FedAvg "
            f"convention: {STOCK_ARRAYS!r} and {STOCK_METRICS!r} with {STOCK_NUM_EXAMPLES!r})"
        )
    return record


def _num_examples(metrics: Mapping) -> int:
    value = metrics.get(STOCK_NUM_EXAMPLES)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MessageError(
            f"stock client's metrics lack {STOCK_NUM_EXAMPLES!r} (a positive integer)"
        )
    if not (math.isfinite(value) and float(value).is_integer() and value > 0):
        raise MessageError(f"{STOCK_NUM_EXAMPLES} = {value}: must be a positive integer")
    return int(value)


def _metric(metrics: Mapping, keys: tuple[str, ...], what: str) -> float:
    for key in keys:
        if key in metrics:
            return _finite(metrics, key)
    raise MessageError(f"stock client's metrics lack {what} (one of {', '.join(keys)})")


def _finite(metrics: Mapping, key: str) -> float:
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MessageError(f"metric {key!r} must be a number")
    if not math.isfinite(value):
        raise MessageError(f"metric {key!r} = {value}: must be finite")
    return float(value)
