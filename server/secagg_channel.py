"""Secure aggregation as an UpdateChannel: the server only ever holds the sum.

The round's exchanges are the protocol's stages (advertise keys, share keys,
masked input, [consistency], unmask), each one `Transport.exchange`. The
training request rides on the masked-input stage, so the plain update never
waits in a client's state between exchanges (Flower moves a node's state
with every message). A client that fails, times out or
sends a message the protocol rejects is a dropped client; fewer than t
survivors abort the round (nothing is released) and the next round proceeds.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedveil.client.secagg_stages import ENC, LOSS_CAP, TRAINING_STAGE, protocol_part, wrap
from fedveil.config import SecAggSection
from fedveil.envelope import Envelope
from fedveil.privacy.dp import SkellamEncoder, SkellamParams
from fedveil.privacy.secagg import (
    Quantizer,
    SecAggAborted,
    SecAggError,
    SecAggServer,
    SessionConfig,
    ThreatModel,
    decode_message,
)

from .aggregation import Aggregate
from .transport import ClientFailure, Transport

log = logging.getLogger("fedveil.secagg")

# Coordinates appended to the update under the quantized encoding: loss, unclipped.
EXTRAS = 2


@dataclass
class Decoded:
    total: torch.Tensor  # Σ w_i x_i (float)
    weight: float
    loss: float | None
    extras: dict[str, float]


class Encoding(Protocol):
    def client_config(self, cohort: int) -> dict[str, Any]: ...
    def dimension(self, model_size: int) -> int: ...
    def bits(self, cohort: int) -> int: ...
    def decode(self, total: np.ndarray, survivors: int, model_size: int) -> Decoded: ...


class QuantizedEncoding:
    """Clip to [-r, r], stochastic rounding to L levels, weight carried masked."""

    def __init__(self, clip_range: float, levels: int, max_weight: int) -> None:
        self.clip_range, self.levels, self.max_weight = clip_range, levels, max_weight
        self._cohort = 0

    def quantizer(self, cohort: int) -> Quantizer:
        return Quantizer(self.clip_range, self.levels, max(cohort, 1), self.max_weight)

    def client_config(self, cohort: int) -> dict[str, Any]:
        self._cohort = cohort
        return {
            ENC + "kind": "quantized",
            ENC + "clip_range": self.clip_range,
            ENC + "levels": self.levels,
            ENC + "max_clients": cohort,
            ENC + "max_weight": self.max_weight,
        }

    def dimension(self, model_size: int) -> int:
        return model_size + EXTRAS + 2  # + [weight, count]

    def bits(self, cohort: int) -> int:
        return self.quantizer(cohort).bits

    def decode(self, total: np.ndarray, survivors: int, model_size: int) -> Decoded:
        q = self.quantizer(self._cohort)
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
            {"unclipped": float(unclipped_c / r * weight_sum)},
        )


class SkellamEncoding:
    """Distributed DP: clients add Skellam noise shares; the sum decodes already noised."""

    def __init__(self, params: SkellamParams) -> None:
        self.params = params
        self.rotation_seed = 0

    def client_config(self, cohort: int) -> dict[str, Any]:
        if cohort > self.params.num_clients:
            raise SecAggAborted(
                f"cohort of {cohort} exceeds the {self.params.num_clients} clients the "
                "distributed-DP modulus was sized for"
            )
        # Public per-round randomness for the shared rotation.
        self.rotation_seed = secrets.randbits(63)
        return {
            ENC + "kind": "skellam",
            ENC + "params": json.dumps(self.params.to_dict()),
            ENC + "rotation_seed": self.rotation_seed,
        }

    def dimension(self, model_size: int) -> int:
        return self.params.padded_dim

    def bits(self, cohort: int) -> int:
        return self.params.bits

    def decode(self, total: np.ndarray, survivors: int, model_size: int) -> Decoded:
        if survivors < self.params.min_clients:
            raise SecAggAborted(
                f"{survivors} survivors < {self.params.min_clients}: too little noise to release"
            )
        noised = SkellamEncoder(self.params, self.rotation_seed).decode(total, survivors)
        return Decoded(
            torch.from_numpy(np.asarray(noised, dtype=np.float32)), float(survivors), None, {}
        )


class SecAggChannel:
    def __init__(self, settings: SecAggSection, encoding: Encoding) -> None:
        self.settings = settings
        self.encoding = encoding
        self.last_session: SessionConfig | None = None

    def session(self, cohort: list[int], model_size: int) -> SessionConfig:
        s = self.settings
        threat = ThreatModel(s.adversarial_rate, s.dropout_rate, s.threat)
        return SessionConfig.create(
            cohort,
            dimension=self.encoding.dimension(model_size),
            modulus_bits=self.encoding.bits(len(cohort)),
            threat=threat,
            neighbors=s.neighbors or None,
            threshold=s.threshold or None,
        )

    def collect(
        self,
        transport: Transport,
        requests: dict[int, Envelope],
        model_size: int,
        timeout_s: float | None,
    ) -> Aggregate | None:
        cohort = sorted(requests)
        round_num = requests[cohort[0]].round
        dropped: dict[int, str] = {}
        if len(cohort) < 2:
            log.warning(
                "round %d: a cohort of %d cannot be securely aggregated", round_num, len(cohort)
            )
            return None
        try:
            enc_config = self.encoding.client_config(len(cohort))
            session = self.session(cohort, model_size)
        except (SecAggError, ValueError) as exc:
            log.warning("round %d: secure aggregation not started: %s", round_num, exc)
            return None
        self.last_session = session
        server = SecAggServer(session)
        try:
            stage_requests = server.next_requests()
            while stage_requests is not None:
                out: dict[int, Envelope] = {}
                for cid, req in stage_requests.items():
                    env = wrap(f"secagg.{req.STAGE.value}", round_num, req)
                    if req.STAGE.value == TRAINING_STAGE:
                        env.config.update(requests[cid].config)
                        env.config.update(enc_config)
                        env.arrays.update(requests[cid].arrays)
                    out[cid] = env
                replies = transport.exchange(out, timeout_s)
                for cid in sorted(out):
                    reply = replies.get(cid, ClientFailure(cid, "no reply"))
                    if isinstance(reply, ClientFailure):
                        dropped.setdefault(cid, reply.reason)
                        continue
                    try:
                        config, arrays = protocol_part(reply)
                        server.receive(cid, decode_message(config, arrays))
                    except (SecAggError, ValueError) as exc:
                        dropped.setdefault(cid, str(exc))
                stage_requests = server.next_requests()
            result = server.finalize()
            decoded = self.encoding.decode(result.total, len(result.survivors), model_size)
        except SecAggAborted as exc:
            log.warning(
                "round %d: secure aggregation aborted, nothing released: %s", round_num, exc
            )
            return None
        for cid in result.dropped:
            dropped.setdefault(cid, "dropped during secure aggregation")
        loss = decoded.loss if decoded.loss is not None else math.nan
        return Aggregate(
            decoded.total, decoded.weight, sorted(result.survivors), loss, dropped, decoded.extras
        )
