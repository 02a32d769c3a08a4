"""The ServerApp's side of drift runs (drift.py submits them): a run directory with a
`drift.json` starts from a registered model version instead of the seed's initialisation.

- kind "evaluate": no training; the version is sent to up to `eval.federated_clients`
  connected devices, each evaluates it on its own held-out data, and the run's summary
  is the example-weighted federated accuracy and loss. Only for runs without DP (drift.py
  refuses the rest): the accuracy of a device's data is a release of it.
- kind "retrain": an ordinary run whose round 1 starts from the version's weights.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedveil.server.coordinator.rundir import RunDir, read_json

if TYPE_CHECKING:  # the coordinator process imports the constants here without torch
    import torch

    from fedveil.config import RunConfig
    from fedveil.server.engine.transport import Transport

log = logging.getLogger("fedveil.serverapp")

DRIFT_FILE = "drift.json"
EVALUATE, RETRAIN = "evaluate", "retrain"


def drift_spec(rd: RunDir) -> dict[str, Any] | None:
    """The run's drift.json ({kind, version, init}), or None for an ordinary run."""
    spec = read_json(rd / DRIFT_FILE)
    if spec is None:
        return None
    if spec.get("kind") not in (EVALUATE, RETRAIN) or not spec.get("init"):
        raise RuntimeError(f"{rd / DRIFT_FILE}: kind must be evaluate or retrain, with init")
    if not Path(spec["init"]).is_file():
        raise RuntimeError(f"{spec['init']}: the model version's file is missing")
    return spec


def evaluate_on_devices(
    cfg: RunConfig, transport: Transport, connected: list[int], weights: torch.Tensor
) -> dict[str, Any]:
    """The model on up to eval.federated_clients connected devices' held-out data."""
    from fedveil.protocol import fields as F
    from fedveil.protocol.envelope import Envelope
    from fedveil.protocol.kinds import Kind
    from fedveil.server.engine.transport import ClientFailure

    k = min(cfg.eval.federated_clients, len(connected))
    pool = list(connected)
    chosen = sorted(pool.pop(secrets.randbelow(len(pool))) for _ in range(k))
    request = Envelope(Kind.EVALUATE, 0, {}, {F.MODEL: weights})
    timeout = cfg.server.round_timeout or None
    replies = transport.exchange({cid: request for cid in chosen}, timeout)
    examples, loss_sum, correct = 0, 0.0, 0.0
    answered = 0
    for cid in chosen:
        reply = replies.get(cid)
        if reply is None or isinstance(reply, ClientFailure):
            log.info("drift evaluation: client %d failed: %s", cid, reply)
            continue
        n = int(reply.config.get(F.NUM_EXAMPLES, 0))
        if n > 0:
            answered += 1
            examples += n
            loss_sum += float(reply.config[F.LOSS]) * n
            correct += float(reply.config[F.ACCURACY]) * n
    if not examples:
        raise RuntimeError(f"drift evaluation: none of the {k} devices asked returned a result")
    return {
        "federated_accuracy": correct / examples,
        "federated_loss": loss_sum / examples,
        "clients_asked": k,
        "clients_answered": answered,
        "examples": examples,
    }
