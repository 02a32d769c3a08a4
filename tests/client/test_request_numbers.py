"""Every number a client reads from a request is a finite number within its limits, or the
request is refused naming the field, the value and the limit (fedveil.protocol.numbers)."""

from __future__ import annotations

import math

import pytest
import torch

import tiny_task
from fedveil.client.runtime import ClientRuntime
from fedveil.config import RunConfig
from fedveil.privacy.encodings import QuantizedEncoding
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.numbers import request_int, request_number

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("value", [NAN, INF, -INF, "1.0", True, None, [1.0]])
def test_a_non_number_fails_every_limit(value):
    with pytest.raises(MessageError, match=r"field 'x' = .*; it must be a finite number >= 1"):
        request_number({"x": value}, "x", at_least=1.0)
    with pytest.raises(MessageError, match=r"field 'x' = .*; it must be an integer"):
        request_int({"x": value}, "x", at_least=0)


def test_limits_missing_fields_and_defaults():
    assert request_number({"x": 2}, "x", above=0.0, at_most=2.0) == 2.0
    with pytest.raises(MessageError, match=r"'x' = 2.5; it must be a finite number > 0 and <= 2"):
        request_number({"x": 2.5}, "x", above=0.0, at_most=2.0)
    with pytest.raises(MessageError, match="field 'x' is missing; it must be a finite number"):
        request_number({}, "x", at_least=0.0)
    assert request_number({}, "x", at_least=0.0, default=0.0) == 0.0
    # A default never excuses a present field.
    with pytest.raises(MessageError, match="'x' = nan"):
        request_number({"x": NAN}, "x", at_least=0.0, default=0.0)
    with pytest.raises(MessageError, match=r"'n' = 3.0 \(float\); it must be an integer"):
        request_int({"n": 3.0}, "n")


def train_request(**fields) -> Envelope:
    config = {
        "seed": 1,
        "local_epochs": 1,
        "local_steps": 0,
        "batch_size": 16,
        "lr": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "prox_mu": 0.0,
        **fields,
    }
    return Envelope("train", 1, config, {"model": torch.zeros(195)})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dp_sgd_noise", NAN),  # was: DP-SGD off (NaN > 0 is False), the update in the clear
        ("dp_sgd_noise", -1.0),
        ("dp_sgd_noise", "1.0"),
        ("lr", NAN),  # was: accepted (NaN <= 0 is False)
        ("momentum", NAN),
        ("weight_decay", INF),
        ("prox_mu", NAN),
    ],
)
def test_the_client_runtime_refuses_a_non_number_naming_it(field, value):
    """In simulation (no device policy) the runtime itself refuses, before training."""
    runtime = ClientRuntime(tiny_task.make(RunConfig()))
    msg = train_request(**{field: value, "dp_sgd_clip": 1.0})
    with pytest.raises(MessageError, match=f"field '{field}' = {value!r}"):
        runtime.handle(0, msg, {})
    assert math.isfinite(runtime.handle(0, train_request(), {}).config["loss"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("enc.clip_range", NAN), ("enc.clip_range", INF), ("enc.levels", 1), ("enc.max_weight", 0)],
)
def test_the_quantized_encoding_a_client_rebuilds_refuses_a_non_number(field, value):
    config = {"enc.clip_range": 1.0, "enc.levels": 16, "enc.max_clients": 4, "enc.max_weight": 1}
    assert QuantizedEncoding.from_request(Envelope("secagg.masked_input", 1, config)).levels == 16
    msg = Envelope("secagg.masked_input", 1, {**config, field: value})
    with pytest.raises(MessageError, match=f"field '{field}' = {value!r}"):
        QuantizedEncoding.from_request(msg)
