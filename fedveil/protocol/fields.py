"""Field names of the requests and replies, each defined once.

A training request's `config` carries the local-training hyper-parameters, the
client-side privacy settings and, under DP, the ledger head the device keeps as a
witness; its `arrays` carry the global model. The secure-aggregation stages carry the
protocol message under `SA` and the update encoding's parameters under `ENC`
(fedveil.privacy.encodings names the fields after that prefix).
"""

from __future__ import annotations

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
DP_SGD_STEPS = "dp_sgd_steps"
DP_SGD_RATE = "dp_sgd_rate"
ACCURACY = "accuracy"
