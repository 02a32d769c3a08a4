"""The training request, assembled in one place from its parts.

A round's training request carries the local-training hyper-parameters (from the
run config), the release mechanism's client-side fields (`ClientPrivacy`, from
central_release.py, distributed_release.py) and the global model; under secure
aggregation the masked-input stage adds the update encoding's fields
(`EncodingRequest`, from `privacy.encodings`). The parts are typed data; only this
module writes them into a request, with the field names of fedveil.protocol.fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from fedveil.config import RunConfig
from fedveil.privacy.encodings import EncodingRequest, QuantizedRequest
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import ConfigValue, Envelope
from fedveil.protocol.kinds import Kind


@dataclass(frozen=True)
class ClientPrivacy:
    """The DP stage's part of a training request."""

    clip_norm: float | None  # the client clips its update to this L2 norm (None: DP-SGD only)
    weighting: str = F.WEIGHT_UNIFORM
    clip_indicator: bool | None = None  # central DP: adaptive clipping's counter (None: not sent)
    ledger_head: dict | None = None  # the ledger's head, which devices keep as a witness


def training_config(cfg: RunConfig, privacy: ClientPrivacy | None) -> dict[str, ConfigValue]:
    """The config of a training request: hyper-parameters, then the privacy fields."""
    c = cfg.client
    config: dict[str, ConfigValue] = {
        F.SEED: cfg.seed,
        F.LOCAL_EPOCHS: c.local_epochs,
        F.LOCAL_STEPS: c.local_steps,
        F.BATCH_SIZE: c.batch_size,
        F.LR: c.lr,
        F.MOMENTUM: c.momentum,
        F.WEIGHT_DECAY: c.weight_decay,
        F.PROX_MU: c.prox_mu,
    }
    if c.dp_sgd_noise > 0:
        config.update({F.DP_SGD_NOISE: c.dp_sgd_noise, F.DP_SGD_CLIP: c.dp_sgd_clip})
        # DP-SGD clients send no example count (client/dpsgd_reply.py): uniform weights.
        config[F.WEIGHTING] = F.WEIGHT_UNIFORM
    if privacy is None:
        return config
    if privacy.clip_norm is not None:
        config[F.CLIP_NORM] = privacy.clip_norm
        config[F.WEIGHTING] = privacy.weighting
    if privacy.clip_indicator is not None:
        config[F.CLIP_INDICATOR] = privacy.clip_indicator
    if privacy.ledger_head is not None:
        config[F.LEDGER_HEAD] = json.dumps(privacy.ledger_head, sort_keys=True)
    return config


def build_train_request(
    cfg: RunConfig, round_num: int, weights: torch.Tensor, privacy: ClientPrivacy | None
) -> Envelope:
    """Round `round_num`'s training request for the global model `weights`."""
    return Envelope(Kind.TRAIN, round_num, training_config(cfg, privacy), {F.MODEL: weights})


def encoding_config(fields: EncodingRequest) -> dict[str, ConfigValue]:
    """The update encoding's fields of a masked-input request."""
    if isinstance(fields, QuantizedRequest):
        return {
            F.ENC_KIND: fields.name,
            F.ENC_CLIP_RANGE: fields.clip_range,
            F.ENC_LEVELS: fields.levels,
            F.ENC_MAX_CLIENTS: fields.max_clients,
            F.ENC_MAX_WEIGHT: fields.max_weight,
        }
    return {
        F.ENC_KIND: fields.name,
        F.ENC_PARAMS: json.dumps(fields.params.to_dict()),
        F.ENC_ROTATION_SEED: fields.rotation_seed,
    }
