"""Field names of the requests and replies, each defined once.

A training request's `config` carries the local-training hyper-parameters, the
client-side privacy settings and, under DP, the ledger head the device keeps as a
witness; its `arrays` carry the global model. The secure-aggregation stages carry the
protocol message under `SA` and the update encoding's parameters under `ENC`; a
masked-input request's `INPUT` says whether the client masks a training update or an
evaluation.
The server assembles a training request in one place (fedveil.server.engine.requests).
"""

from __future__ import annotations

from collections.abc import Mapping

# -- training request: config -------------------------------------------------
SEED = "seed"
LOCAL_EPOCHS = "local_epochs"
LOCAL_STEPS = "local_steps"
BATCH_SIZE = "batch_size"
LR = "lr"
MOMENTUM = "momentum"
WEIGHT_DECAY = "weight_decay"
PROX_MU = "prox_mu"
# The local-training hyper-parameters, with the type each is parsed as.
HYPERPARAMETERS: tuple[tuple[str, type], ...] = (
    (LOCAL_EPOCHS, int),
    (LOCAL_STEPS, int),
    (BATCH_SIZE, int),
    (LR, float),
    (MOMENTUM, float),
    (WEIGHT_DECAY, float),
    (PROX_MU, float),
)
DP_SGD_NOISE = "dp_sgd_noise"  # local DP-SGD noise multiplier (> 0: DP-SGD on)
DP_SGD_CLIP = "dp_sgd_clip"  # its per-example clip
CLIP_NORM = "clip_norm"  # user-level DP: the client clips its update to this L2 norm
WEIGHTING = "weighting"  # WEIGHT_BY_EXAMPLES or WEIGHT_UNIFORM
WEIGHT_BY_EXAMPLES = "examples"
WEIGHT_UNIFORM = "uniform"
CLIP_INDICATOR = "clip_indicator"  # adaptive clipping: reply UNCLIPPED
LEDGER_HEAD = "ledger.head"  # the privacy ledger's head (JSON), kept by devices as a witness

# -- prefixes of protocol fields inside a request or reply ------------------------
SA = "sa."  # a secure-aggregation message's own fields
ENC = "enc."  # the update encoding's parameters (masked-input stage only)

# -- masked-input request: the update encoding's fields -------------------------
ENC_KIND = ENC + "kind"  # the encoding's name
ENC_CLIP_RANGE = ENC + "clip_range"  # quantized: clip to [-r, r]
ENC_LEVELS = ENC + "levels"  # quantized: rounding levels
ENC_MAX_CLIENTS = ENC + "max_clients"  # quantized: the cohort the sum is sized for
ENC_MAX_WEIGHT = ENC + "max_weight"  # quantized: the largest weight a client may carry
ENC_PARAMS = ENC + "params"  # Skellam: the distributed-DP parameters (JSON)
ENC_ROTATION_SEED = ENC + "rotation_seed"  # Skellam: the round's public rotation seed

# -- masked-input request: what the client masks -------------------------------------
# Absent or INPUT_UPDATE: its training update. INPUT_EVALUATION: no training; its bounded
# evaluation of the request's model (privacy/dp/evaluation.py: accuracy and loss clipped to
# EVAL_LOSS_CAP, each in [0, 1], weight 1), so an evaluation is summed like an update.
INPUT = "input"
INPUT_UPDATE = "update"
INPUT_EVALUATION = "evaluation"
EVAL_LOSS_CAP = "eval_loss_cap"


def is_evaluation_input(config: Mapping[str, object]) -> bool:
    """Whether a masked-input request asks for an evaluation instead of a training update."""
    return config.get(INPUT, INPUT_UPDATE) == INPUT_EVALUATION


# -- arrays ----------------------------------------------------------------------
MODEL = "model"  # the global model (train and evaluate requests)
DELTA = "delta"  # the update (plain train replies)

# -- replies: config --------------------------------------------------------------
CLIENT_ID = "client_id"  # hello
SIZE = "size"  # hello: the model's number of values
NUM_EXAMPLES = "num_examples"
LOSS = "loss"
STEPS = "steps"
WEIGHT = "weight"
UNCLIPPED = "unclipped"  # 1 when the update was within CLIP_NORM (CLIP_INDICATOR)
# No DP-SGD figures (steps, rate batch/n): they give the client's n (client/dpsgd_reply.py).
ACCURACY = "accuracy"
