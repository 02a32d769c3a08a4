"""A stock Flower client's train reply as the ServerApp reads it (flower_stock_codec):
arrays that are not real floats, or are not in the model, are refused with a
MessageError naming the array, so the round drops that client by name. Before, a
big-endian or string array raised torch's ValueError/TypeError out of the exchange (the
ServerApp's round failed), and complex, integer or boolean weights were cast silently."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.flower_stock_codec import StockCodec


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    # BatchNorm: its state_dict has an int64 step count besides the float weights.
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def _reply(codec: StockCodec, arrays: dict[str, np.ndarray]) -> Envelope:
    request = Envelope(Kind.TRAIN, 1, {}, {"model": codec.layout.get().clone()})
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": 5, "train_loss": 0.5}),
        }
    )
    return codec.reply(request, content)


def _state(codec: StockCodec) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in codec.layout.module.state_dict().items()}


def test_an_honest_reply_with_every_state_entry_is_read() -> None:
    codec = StockCodec(_model())
    state = _state(codec)
    state["0.weight"] = state["0.weight"] + np.float32(0.25)
    state["1.num_batches_tracked"] = np.array(7)  # int64, no part of the update
    delta = _reply(codec, state).arrays["delta"]
    assert delta.dtype == torch.float32
    assert torch.equal(delta[:12], torch.full((12,), 0.25))
    assert torch.count_nonzero(delta[12:]) == 0
    # Any byte order and float width: read as the same float32 values.
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in state.items()}
    assert torch.equal(_reply(codec, swapped).arrays["delta"], delta)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda v: v.astype(np.complex64), "'0.weight' has dtype complex64"),
        (lambda v: v.astype(np.uint16), "'0.weight' has dtype uint16"),
        (lambda v: v.astype(bool), "'0.weight' has dtype bool"),
        (lambda v: np.full(v.shape, "a"), "'0.weight' has dtype <U1"),
    ],
)
def test_weights_that_are_not_real_floats_are_refused_naming_the_array(change, named) -> None:
    codec = StockCodec(_model())
    state = _state(codec)
    state["0.weight"] = change(state["0.weight"])
    with pytest.raises(MessageError, match=named):
        _reply(codec, state)


def test_an_array_not_in_the_model_is_refused() -> None:
    codec = StockCodec(_model())
    with pytest.raises(MessageError, match="array 'extra' is not in the model"):
        _reply(codec, {**_state(codec), "extra": np.zeros(2, np.float32)})
