"""Secure aggregation: pairwise zero-sum masks with dropout recovery (SecAgg / SecAgg+).

Transport-free: parties exchange typed messages (`messages`) that encode to a config dict plus
an arrays dict. Modules, bottom-up:

* `params`    – degree k / threshold t from n and a threat model (Bell et al. 2020)
* `graph`     – complete or randomly permuted Harary neighbour graph
* `session`   – `SessionConfig`, the parameters every party agrees on
* `crypto`, `shamir`, `masking`, `randomness` – primitives (all from `cryptography`)
* `quantize`  – float ↔ Z_(2^b) with no wrap-around, weight packing
* `messages`, `wire` – typed messages and their strict codec
* `client`, `server` – the two state machines
* `in_memory` – `run_in_memory`, a whole round over dicts
"""

from . import crypto, shamir  # noqa: F401  (re-exported for tools and tests)
from .client import ClientStage, SecAggClient
from .errors import SecAggAborted, SecAggError, SecAggProtocolError, SecAggStateError
from .in_memory import DropoutPattern, RoundReport, run_in_memory
from .messages import (
    AdvertiseKeys,
    AdvertiseRequest,
    ConsistencyRequest,
    ConsistencySignature,
    MaskedInput,
    MaskedInputRequest,
    Message,
    ShareKeys,
    ShareKeysRequest,
    Stage,
    UnmaskRequest,
    UnmaskShares,
    decode_message,
)
from .params import GraphParameters, ThreatMode, ThreatModel, find_parameters
from .quantize import Quantizer, pack, unpack
from .server import AggregateResult, Rejection, SecAggServer
from .session import SIMULATION_RUN_ID, SessionConfig, flower_run_id

__all__ = [
    "SIMULATION_RUN_ID",
    "AdvertiseKeys",
    "AdvertiseRequest",
    "AggregateResult",
    "ClientStage",
    "ConsistencyRequest",
    "ConsistencySignature",
    "DropoutPattern",
    "GraphParameters",
    "MaskedInput",
    "MaskedInputRequest",
    "Message",
    "Quantizer",
    "Rejection",
    "RoundReport",
    "SecAggAborted",
    "SecAggClient",
    "SecAggError",
    "SecAggProtocolError",
    "SecAggServer",
    "SecAggStateError",
    "SessionConfig",
    "ShareKeys",
    "ShareKeysRequest",
    "Stage",
    "ThreatMode",
    "ThreatModel",
    "UnmaskRequest",
    "UnmaskShares",
    "decode_message",
    "find_parameters",
    "flower_run_id",
    "pack",
    "run_in_memory",
    "unpack",
]
