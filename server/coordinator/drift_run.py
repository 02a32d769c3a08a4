"""The ServerApp's side of drift runs (drift.py submits them): a run directory with a
`drift.json` starts from a registered model version instead of the seed's initialisation.

- kind "evaluate": no training; the version is sent to up to `eval.federated_clients`
  connected devices, each evaluates it on its own held-out data. For a version without DP
  the run's summary is the federated accuracy and loss weighted by example counts, with
  the devices asked and answered. A device's reply is refused unless its count is an
  integer in [1, 10^7] and its accuracy in [0, 1] and loss finite and >= 0; each
  device's weight is capped at the median count of the devices that answered
  (`robust_summary`), so with k answers no device carries more than 1/ceil(k/2) of the
  weight, and a device lying alone moves the accuracy by at most that much (the DP
  path gives each device one unit of weight).
  For a DP version (drift.json's "dp": the calibrated plan, the version's evaluations
  charged before and its budget) the evaluation is a DP release
  (server/engine/secure_evaluation.py): under secure aggregation, charged to the run's
  signed ledger before unmasking, noised; the summary holds the noised means and the
  accounted figures only, the counts and exact sums go to the private annex.
- kind "retrain": an ordinary run whose round 1 starts from the version's weights.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedveil.server.coordinator.rundir import RunDir, read_json
from fedveil.server.engine.evaluation_answer import check_evaluation_answer

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
    if spec.get("dp") is not None and spec["kind"] != EVALUATE:
        raise RuntimeError(f"{rd / DRIFT_FILE}: 'dp' is for an evaluation only")
    return spec


def chosen_devices(connected: list[int], k: int) -> list[int]:
    """`k` of the connected devices, drawn with the OS CSPRNG (sorted)."""
    pool = list(connected)
    return sorted(pool.pop(secrets.randbelow(len(pool))) for _ in range(min(k, len(pool))))


def evaluate_on_devices(
    cfg: RunConfig, transport: Transport, connected: list[int], weights: torch.Tensor
) -> dict[str, Any]:
    """The model on up to eval.federated_clients connected devices' held-out data."""
    from fedveil.protocol import fields as F
    from fedveil.protocol.envelope import Envelope
    from fedveil.protocol.kinds import Kind
    from fedveil.server.engine.transport import ClientFailure

    chosen = chosen_devices(connected, cfg.eval.federated_clients)
    k = len(chosen)
    request = Envelope(Kind.EVALUATE, 0, {}, {F.MODEL: weights})
    timeout = cfg.server.round_timeout or None
    replies = transport.exchange({cid: request for cid in chosen}, timeout)
    answers: list[tuple[int, Mapping[str, Any]]] = []
    for cid in chosen:
        reply = replies.get(cid)
        if reply is None or isinstance(reply, ClientFailure):
            log.info("drift evaluation: client %d failed: %s", cid, reply)
            continue
        answers.append((cid, reply.config))
    summary = robust_summary(answers)
    if summary is None:
        raise RuntimeError(f"drift evaluation: none of the {k} devices asked returned a result")
    return {**summary, "clients_asked": k}


def robust_summary(answers: list[tuple[int, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """Accuracy and loss over the valid answers, each device's weight min(its count, the
    median count of the valid answers); None when no answer is valid."""
    valid: list[tuple[int, float, float]] = []
    refused = 0
    for cid, config in answers:
        try:
            valid.append(check_evaluation_answer(config))
        except ValueError as exc:
            refused += 1
            log.warning("drift evaluation: client %d's reply refused: %s", cid, exc)
    if not valid:
        return None
    counts = sorted(n for n, _, _ in valid)
    cap = counts[(len(counts) - 1) // 2]  # the lower median: a count some device reported
    weights = [min(n, cap) for n, _, _ in valid]
    total = sum(weights)
    return {
        "federated_accuracy": sum(w * a for w, (_, a, _) in zip(weights, valid, strict=True))
        / total,
        "federated_loss": sum(w * loss for w, (_, _, loss) in zip(weights, valid, strict=True))
        / total,
        "clients_answered": len(valid),
        "clients_refused": refused,
        "examples": sum(counts),
        "weight_cap": cap,
    }


def evaluate_on_devices_dp(
    cfg: RunConfig,
    transport: Transport,
    connected: list[int],
    weights: torch.Tensor,
    spec: dict[str, Any],
    rd: RunDir,
    *,
    roster: Mapping[int, bytes] | None,
    secagg_run_id: bytes,
) -> dict[str, Any]:
    """A DP version's evaluation: the public summary (noised means, accounted figures);
    the exact sums and who answered go to the run's private annex (mode 600)."""
    from fedveil.privacy.dp import Ledger
    from fedveil.privacy.dp.evaluation import EvaluationPlan, evaluation_event
    from fedveil.privacy.dp.signing import load_or_create_signer
    from fedveil.server.engine.privacy_report import ledger_path
    from fedveil.server.engine.runstore import RunStore
    from fedveil.server.engine.secure_evaluation import evaluate_securely

    dp = spec["dp"]
    plan = EvaluationPlan.from_dict(dp["plan"])
    path = ledger_path(rd.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Signed with the coordinator user's key, where `fedveil privacy verify` finds it.
    ledger = Ledger(path, run_id=rd.run_id, signer=load_or_create_signer())
    result = evaluate_securely(
        transport,
        chosen_devices(connected, cfg.eval.federated_clients),
        weights,
        plan,
        cfg.secagg,
        ledger,
        prior=[evaluation_event(float(z)) for z in dp.get("prior", [])],
        budget=float(dp["budget"]),
        roster=roster,
        run_id=secagg_run_id,
        timeout_s=cfg.server.round_timeout or None,
        ledger_extra={"model_version": spec["version"]},
    )
    RunStore(rd.path).append_private({"kind": "drift_evaluation", **result.private})
    # No privacy report: the run report's words are a training run's (models per round);
    # the ledger verifies on its own, and the summary states what was released.
    return result.public
