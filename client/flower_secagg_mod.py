"""The client side of fedveil's secure aggregation for a Flower Message-API app: a mod.

    app = ClientApp(mods=[fedveil_secagg_mod])

The server (fedveil.flower.secure around its Grid) runs each round's train exchange as
the protocol's stages (advertise keys, share keys, masked input, unmask), all of them
`train` messages carrying fedveil's records (fedveil.protocol.flower_secagg_codec). The
mod answers the key and unmask stages itself (client.secagg_stages: fedveil's own
client code) and, at the masked-input stage, calls the app's @app.train() function on
the strategy's message, takes the update (reply arrays minus sent arrays), the metrics
the server named and the weight (the strategy's weighting metric, 1 under DP), and
sends them quantized and masked in the same reply: the plain update never leaves the
client. Federated evaluation runs the same way over the app's @app.evaluate() metrics.

A plain train or evaluate message (a server without secure aggregation) is refused:
this client shows its update and metrics only to the protocol. Every session is held to
the client's own plan, read from the app's run config (client/flower_secagg_plan.py): a
session below its threat model's floor is refused before any key, and a survivor set
below its survivor floor gets no unmasking share.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord
from flwr.clientapp.typing import ClientAppCallable

from fedveil.client.flower_secagg_plan import mod_plan
from fedveil.client.secagg_stages import handle_secagg
from fedveil.privacy.dp.clipping import clip_update
from fedveil.privacy.secagg import flower_run_id
from fedveil.protocol import flower_secagg_codec as codec
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import CLIP_NORM, ENC_CLIP_RANGE, ENC_MAX_WEIGHT, LOSS, WEIGHT
from fedveil.protocol.kinds import ErrorCode
from fedveil.protocol.piggyback import detach, join_replies

log = logging.getLogger("fedveil.client")

PLAIN_REFUSED = (
    "local policy: this client (fedveil_secagg_mod) sends its update and metrics only "
    "inside fedveil's secure aggregation; the server sent a plain {mtype} message (wrap "
    "the server's Grid: strategy.start(grid=fedveil.flower.secure(grid, strategy), ...))"
)


class AppFailed(RuntimeError):
    """The app's own train or evaluate function answered with an error."""


def fedveil_secagg_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A Flower client mod: fedveil's secure-aggregation stages around the app's functions."""
    mtype = str(msg.metadata.message_type)
    if not codec.is_protocol(msg.content):
        if mtype.split(".")[0] in (codec.TRAIN, codec.EVALUATE):
            reason = PLAIN_REFUSED.format(mtype=mtype)
            log.warning("node %d: %s", context.node_id, reason)
            return Message(Error(ErrorCode.BAD_MESSAGE.value, reason), reply_to=msg)
        return call_next(msg, context)
    cid = int(context.node_id)
    # Train and evaluate sessions live apart: both may be of the same round.
    store = f"{codec.PREFIX}{mtype.split('.')[0]}."
    state = _load(context, store)

    def local(_cid: int, stage: Envelope) -> tuple[dict[str, Any], torch.Tensor]:
        return local_contribution(msg, context, call_next, stage)

    def answer(request: Envelope) -> Envelope:
        return handle_secagg(
            cid,
            request,
            state,
            local,
            run_id=flower_run_id(context.run_id),
            min_survivors=plan.min_survivors,
            floor=plan.floor,
        )

    try:
        plan = mod_plan(context.run_config)  # the client's own, never the message's
        request, rider = detach(codec.unpack(msg.content))
        if rider is None:
            reply = answer(request)
        else:  # the next round's key stage rides along: each half answered on its own
            reply = join_replies(_attempt(answer, request), _attempt(answer, rider), request)
        _save(context, store, state)
    except MessageError as exc:
        log.warning("node %d: secure-aggregation message refused: %s", cid, exc)
        return Message(Error(ErrorCode.BAD_MESSAGE.value, str(exc)), reply_to=msg)
    except Exception as exc:  # the app's failure or ours: an error reply, never a crash
        log.warning("node %d: secure-aggregation stage failed: %s", cid, exc)
        reason = f"{type(exc).__name__}: {exc}"
        return Message(Error(ErrorCode.CLIENT_FAILURE.value, reason), reply_to=msg)
    return Message(codec.pack(reply), reply_to=msg)


def _attempt(answer: Callable[[Envelope], Envelope], request: Envelope) -> Envelope | str:
    """One half of a message with a rider: its answer, or why it failed."""
    try:
        return answer(request)
    except Exception as exc:  # the other half still counts
        log.warning("secure-aggregation %s refused: %s", request.kind, exc)
        return f"{type(exc).__name__}: {exc}"


def _load(context: Context, store: str) -> dict[str, Any]:
    """The protocol state kept in `context.state` under `store` (client.flower_app's flat
    layout: config values in a ConfigRecord, arrays in an ArrayRecord)."""
    state: dict[str, Any] = {}
    config = context.state.get(store + "config")
    if isinstance(config, ConfigRecord):
        state.update(config)
    arrays = context.state.get(store + "arrays")
    if isinstance(arrays, ArrayRecord):
        state.update({k: a.numpy() for k, a in arrays.items()})
    return state


def _save(context: Context, store: str, state: dict[str, Any]) -> None:
    arrays = {k: v for k, v in state.items() if isinstance(v, (np.ndarray, torch.Tensor))}
    config = {k: v for k, v in state.items() if k not in arrays}
    context.state[store + "config"] = ConfigRecord(config)
    context.state[store + "arrays"] = ArrayRecord(
        {k: Array(np.ascontiguousarray(np.asarray(v))) for k, v in arrays.items()}
    )


def local_contribution(
    msg: Message, context: Context, call_next: ClientAppCallable, stage: Envelope
) -> tuple[dict[str, Any], torch.Tensor]:
    """(reply fields, vector) of the masked-input stage: the app's update (train) and the
    metrics the server named, from the app's own function on the strategy's message."""
    purpose = stage.get(codec.PURPOSE, str)
    if purpose not in (codec.TRAIN, codec.EVALUATE):
        raise MessageError(f"{codec.PURPOSE} = {purpose!r}: must be 'train' or 'evaluate'")
    app_content = codec.app_part(msg.content)
    sent = _only(app_content.array_records, "ArrayRecord", "the server's message")
    msg.content = app_content  # the app sees the strategy's message as it was sent
    answer = call_next(msg, context)
    if answer.has_error():
        raise AppFailed(f"the app's {purpose} function failed: {answer.error.reason}")
    metrics = _only(answer.content.metric_records, "MetricRecord", f"the app's {purpose} reply")
    parts: list[np.ndarray] = []
    if purpose == codec.TRAIN:
        new = _only(answer.content.array_records, "ArrayRecord", "the app's train reply")
        parts.append(update_of(sent, new))
    parts.append(_metrics(stage, metrics))
    vector = np.concatenate(parts).astype(np.float32)
    clip = stage.config.get(CLIP_NORM)
    if clip:  # DP: the server's clip, before quantization (which then holds it exactly)
        vector = clip_update(vector, float(clip)).vector
    weight = _weight(stage, metrics)
    return {LOSS: 0.0, WEIGHT: weight}, torch.from_numpy(vector)


def update_of(sent: ArrayRecord, new: ArrayRecord) -> np.ndarray:
    """The app's update, reply minus sent, flat in the sent record's order (float64)."""
    if list(new.keys()) != list(sent.keys()):
        missing = sorted(set(sent.keys()) ^ set(new.keys()))[:5]
        raise MessageError(
            f"the app's train reply: its ArrayRecord's keys differ from the model sent "
            f"(e.g. {missing}); secure aggregation sums the same arrays from every client"
        )
    out = []
    for key, array in sent.items():
        before, after = array.numpy(), new[key].numpy()
        if after.shape != before.shape:
            raise MessageError(
                f"the app's train reply: array {key!r} has shape {after.shape}, the model "
                f"sent has {before.shape}"
            )
        out.append((after.astype(np.float64) - before.astype(np.float64)).ravel())
    delta = np.concatenate(out) if out else np.zeros(0)
    if not np.isfinite(delta).all():
        raise MessageError("the app's train reply: its arrays contain NaN or Inf")
    return delta


def _metrics(stage: Envelope, metrics: MetricRecord) -> np.ndarray:
    """The named metrics, scaled from [-range, range] into the encoding's clip range."""
    names = stage.config.get(codec.METRICS, [])
    if not names:
        return np.zeros(0)
    span = float(stage.get(codec.METRIC_RANGE, (int, float)))
    clip = float(stage.get(ENC_CLIP_RANGE, (int, float)))
    values = []
    for name in names:
        value = metrics.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MessageError(
                f"the app's reply metrics lack the number {name!r}, which the server "
                f"averages inside secure aggregation (its metrics: {sorted(metrics)[:8]})"
            )
        values.append(float(value) * clip / span)
    return np.asarray(values)


def _weight(stage: Envelope, metrics: MetricRecord) -> int:
    key = stage.get(codec.WEIGHT_KEY, str)
    if not key:  # DP: every client weighs 1, whatever it reports
        return 1
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MessageError(f"the app's reply metrics lack the number {key!r} (its weight)")
    most = stage.get(ENC_MAX_WEIGHT, int)
    if not 0 <= value <= most:
        raise MessageError(
            f"the app's reply: {key} = {value} is outside [0, max_weight = {most}]; raise "
            "max_weight in fedveil.flower.secure(...) to the largest client's"
        )
    return round(value)


def _only(records: Any, kind: str, where: str) -> Any:
    values = list(records.values())
    if len(values) != 1:
        raise MessageError(f"{where} has {len(values)} {kind}s; secure aggregation needs one")
    return values[0]
