"""The update encodings of secure aggregation, one class each, both directions.

A client's update enters secure aggregation as an integer vector in Z_(2^b); the
server unmasks only the sum and decodes it. Each encoding is one class: the server
makes it from the run's settings and puts its `request_fields` (typed data, which the
server's request builder writes) in the masked-input request; the client rebuilds it
from that request (`from_request`) and `encode`s its update; the server `decode`s the
sum with the same object that wrote the request.

* `QuantizedEncoding`: clip to [-r, r], stochastic rounding to L levels, the weight
  and the `EXTRAS` (loss, unclipped) carried masked after the update.
* `SkellamEncoding`: distributed DP, each client adds a Skellam noise share; the sum
  decodes already noised.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import (
    ENC_CLIP_RANGE,
    ENC_KIND,
    ENC_LEVELS,
    ENC_MAX_CLIENTS,
    ENC_MAX_WEIGHT,
    ENC_PARAMS,
    ENC_ROTATION_SEED,
    LOSS,
    UNCLIPPED,
    WEIGHT,
)
from fedveil.protocol.numbers import request_int, request_number

from .dp import SkellamEncoder, SkellamParams
from .secagg import Quantizer, SecAggAborted

# Fields of the masked-input request, under the ENC prefix (named in protocol.fields).
KIND = ENC_KIND
CLIP_RANGE = ENC_CLIP_RANGE
LEVELS = ENC_LEVELS
MAX_CLIENTS = ENC_MAX_CLIENTS
MAX_WEIGHT = ENC_MAX_WEIGHT
PARAMS = ENC_PARAMS
ROTATION_SEED = ENC_ROTATION_SEED

# Reply fields carried masked after the update (quantized encoding), in this order,
# each scaled into [0, r]: the training loss (capped at LOSS_CAP) and the 0/1
# adaptive-clipping counter.
EXTRAS = (LOSS, UNCLIPPED)
LOSS_CAP = 16.0


@dataclass(frozen=True)
class QuantizedRequest:
    """The quantized encoding's part of a masked-input request."""

    clip_range: float
    levels: int
    max_clients: int
    max_weight: int
    name: str = "quantized"


@dataclass(frozen=True)
class SkellamRequest:
    """The Skellam (distributed-DP) encoding's part of a masked-input request."""

    params: SkellamParams
    rotation_seed: int
    name: str = "skellam"


EncodingRequest = QuantizedRequest | SkellamRequest


@dataclass
class Decoded:
    total: torch.Tensor  # Σ w_i x_i (float)
    weight: float
    loss: float | None
    extras: dict[str, float]


class Encoding(Protocol):
    """What the server's secure-aggregation channel needs of an encoding."""

    def request_fields(self, cohort: int) -> EncodingRequest: ...
    def dimension(self, model_size: int) -> int: ...
    def bits(self, cohort: int) -> int: ...
    def decode(self, total: np.ndarray, survivors: int, model_size: int) -> Decoded: ...


class QuantizedEncoding:
    """Clip to [-r, r], stochastic rounding to L levels, weight carried masked."""

    NAME = "quantized"

    def __init__(
        self, clip_range: float, levels: int, max_weight: int, max_clients: int = 0
    ) -> None:
        self.clip_range, self.levels, self.max_weight = clip_range, levels, max_weight
        # The cohort the last request was written for (server), or the request's (client).
        self.max_clients = max_clients

    def quantizer(self, cohort: int) -> Quantizer:
        return Quantizer(self.clip_range, self.levels, max(cohort, 1), self.max_weight)

    # -- server: the request --------------------------------------------------
    def request_fields(self, cohort: int) -> QuantizedRequest:
        self.max_clients = cohort
        return QuantizedRequest(self.clip_range, self.levels, cohort, self.max_weight, self.NAME)

    def dimension(self, model_size: int) -> int:
        return model_size + len(EXTRAS) + 2  # + [weight, count]

    def bits(self, cohort: int) -> int:
        return self.quantizer(cohort).bits

    # -- client: the update -----------------------------------------------------
    @classmethod
    def from_request(cls, msg: Envelope) -> QuantizedEncoding:
        return cls(
            clip_range=request_number(msg.config, CLIP_RANGE, above=0.0, where=msg.kind),
            levels=request_int(msg.config, LEVELS, at_least=2, where=msg.kind),
            max_clients=request_int(msg.config, MAX_CLIENTS, at_least=1, where=msg.kind),
            max_weight=request_int(msg.config, MAX_WEIGHT, at_least=1, where=msg.kind),
        )

    def encode(
        self, vector: np.ndarray, reply: Mapping[str, Any], l2_bound: float | None
    ) -> np.ndarray:
        """The client's input: `vector` and the EXTRAS of its training `reply`, with its
        weight. `l2_bound`: the clip the update was held to (the quantizer's check)."""
        q = Quantizer(
            clip_range=self.clip_range,
            levels=self.levels,
            max_clients=self.max_clients,
            max_weight=self.max_weight,
        )
        r = q.clip_range
        loss = min(max(float(reply[LOSS]), 0.0), LOSS_CAP)
        extras = [r * loss / LOSS_CAP, r * float(reply.get(UNCLIPPED, 0))]
        weight = min(round(reply[WEIGHT]), q.max_weight)
        # The quantizer reads float32 directly and the parts in order: no float64 copy.
        return q.encode_weighted([vector, np.array(extras)], weight, l2_bound=l2_bound)

    # -- server: the sum ----------------------------------------------------------
    def decode(self, total: np.ndarray, survivors: int, model_size: int) -> Decoded:
        q = self.quantizer(self.max_clients)
        mean, weight_sum, count = q.decode_weighted_mean(total)
        if count != survivors:
            raise SecAggAborted(f"sum counts {count} contributors, {survivors} survived")
        r = self.clip_range
        body, loss_c, unclipped_c = mean[:model_size], mean[model_size], mean[model_size + 1]
        return Decoded(
            torch.from_numpy((body * weight_sum).astype(np.float32)),
            float(weight_sum),
            float(loss_c / r * LOSS_CAP),
            # unclipped is a 0/1 counter; weights are 1 whenever it is used (DP)
            {UNCLIPPED: float(unclipped_c / r * weight_sum)},
        )


class SkellamEncoding:
    """Distributed DP: clients add Skellam noise shares; the sum decodes already noised."""

    NAME = "skellam"

    def __init__(self, params: SkellamParams, rotation_seed: int = 0) -> None:
        self.params = params
        self.rotation_seed = rotation_seed

    # -- server: the request --------------------------------------------------
    def request_fields(self, cohort: int) -> SkellamRequest:
        if cohort > self.params.num_clients:
            raise SecAggAborted(
                f"cohort of {cohort} exceeds the {self.params.num_clients} clients the "
                "distributed-DP modulus was sized for"
            )
        # Public per-round randomness for the shared rotation.
        self.rotation_seed = secrets.randbits(63)
        return SkellamRequest(self.params, self.rotation_seed, self.NAME)

    def dimension(self, model_size: int) -> int:
        return self.params.padded_dim

    def bits(self, cohort: int) -> int:
        return self.params.bits

    # -- client: the update -----------------------------------------------------
    @staticmethod
    def requested_params(msg: Envelope) -> SkellamParams:
        """The parameters a request names (a client checks them against its own)."""
        try:
            return SkellamParams.from_dict(json.loads(msg.get(PARAMS, str)))
        except (TypeError, ValueError, KeyError) as exc:
            raise MessageError(f"{msg.kind} message: enc.params unreadable: {exc}") from None

    @classmethod
    def from_request(cls, msg: Envelope, params: SkellamParams) -> SkellamEncoding:
        """The request's encoding with `params`: the client's own, never the server's."""
        return cls(params, request_int(msg.config, ROTATION_SEED, at_least=0, where=msg.kind))

    def encode(self, vector: np.ndarray) -> np.ndarray:
        return SkellamEncoder(self.params, self.rotation_seed).encode(vector)

    # -- server: the sum ----------------------------------------------------------
    def decode(self, total: np.ndarray, survivors: int, model_size: int) -> Decoded:
        if survivors < self.params.min_clients:
            raise SecAggAborted(
                f"{survivors} survivors < {self.params.min_clients}: too little noise to release"
            )
        noised = SkellamEncoder(self.params, self.rotation_seed).decode(total, survivors)
        return Decoded(
            torch.from_numpy(np.asarray(noised, dtype=np.float32)), float(survivors), None, {}
        )


def encoding_name(msg: Envelope) -> str:
    """The encoding a masked-input request names."""
    return msg.get(KIND, str)


def is_skellam(msg: Envelope) -> bool:
    """Whether a request names the distributed-DP encoding (no check of the rest)."""
    return msg.config.get(KIND) == SkellamEncoding.NAME
