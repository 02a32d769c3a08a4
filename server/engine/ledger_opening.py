"""Every DP run opens its signed ledger before round 1, and every DP request shows its head.

A run is a DP run when it has a release mechanism (dp.mechanism = central |
distributed) or trains with DP-SGD (client.dp_sgd_noise > 0). Its ledger starts with
a signed opening record (ledger.Ledger.open): the run's public plan, the cohort
commitment where cohorts are secret, and the ledger's public key. From round 1 on,
and from the first asynchronous dispatch, every training request carries the head
(ledger_head.head_message: the opening and the last entry), which a device verifies
against the key it pinned from the opening (client/edge/ledger_guard.py).

`DpSgdLedger` is the ledger of a DP-SGD-only run (no release mechanism): it accounts
nothing itself (the example-level guarantee is each device's), but it opens, gives the
head every request carries, and closes with the run, so devices witness it as they
witness the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedveil.config import RunConfig
from fedveil.privacy.dp import Ledger
from fedveil.privacy.dp.ledger import MODEL_SHA256
from fedveil.privacy.dp.ledger_head import head_message, is_dp_run
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.server.engine.requests import ClientPrivacy

__all__ = [
    "DpSgdLedger",
    "is_dp_run",
    "open_ledger",
    "open_run_ledger",
    "opening_plan",
    "request_head",
]


def opening_plan(cfg: RunConfig) -> dict[str, Any]:
    """The run's public privacy plan, as the opening record states it."""
    dp, s = cfg.dp, cfg.server
    return {
        "mechanism": dp.mechanism,
        "epsilon": dp.epsilon,
        "delta": dp.delta,
        "clip": dp.clip,
        "noise_multiplier": dp.noise_multiplier,
        "neighbouring": dp.neighbouring,
        "accountant": dp.accountant,
        "budget_against": dp.budget_against,
        "adaptive_clip": dp.adaptive_clip,
        "dp_sgd_noise": cfg.client.dp_sgd_noise,
        "dp_sgd_clip": cfg.client.dp_sgd_clip,
        "secagg": cfg.secagg.enabled,
        "secagg_threat": cfg.secagg.threat if cfg.secagg.enabled else None,
        "mode": s.mode,
        "sampling": s.sampling,
        "rounds": s.rounds,
        "max_participations": s.max_participations,
    }


def open_ledger(ledger: Ledger, cfg: RunConfig, cohort_commitment: str | None) -> None:
    """Write the opening record of a new ledger (a resumed one keeps its own)."""
    if len(ledger) or ledger.signer is None:
        return  # resumed; or an unsigned ledger (unit tests), which devices refuse anyway
    fields: dict[str, Any] = {"plan": opening_plan(cfg)}
    if cohort_commitment is not None:
        fields["cohort_commitment"] = cohort_commitment
    ledger.open(fields)


def open_run_ledger(
    ledger_path: Path,
    cfg: RunConfig,
    cohort_commitment: str | None,
    *,
    run_id: str | None,
    signer: LedgerSigner | None,
) -> Ledger:
    """The run's ledger at `ledger_path` (its folder made), with its opening record
    written if it is new: what every DP run's ledger holder starts with."""
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path, run_id=run_id, signer=signer)
    open_ledger(ledger, cfg, cohort_commitment)
    return ledger


def request_head(ledger: Ledger) -> dict[str, Any] | None:
    """The head for a request; None only for a ledger devices cannot verify (unsigned,
    or a schema-2 ledger resumed), which they then refuse."""
    return head_message(ledger) if ledger.opening is not None else None


class DpSgdLedger:
    """The opened, closed ledger of a DP-SGD-only run (module doc)."""

    def __init__(
        self,
        cfg: RunConfig,
        ledger_path: Path,
        *,
        run_id: str | None = None,
        signer: LedgerSigner | None = None,
    ) -> None:
        self.ledger = open_run_ledger(ledger_path, cfg, None, run_id=run_id, signer=signer)

    def client_fields(self) -> ClientPrivacy:
        """No clip, no weighting (nothing is released centrally): the head only."""
        return ClientPrivacy(clip_norm=None, ledger_head=request_head(self.ledger))

    def close(
        self,
        kind: str,
        training_round: int,
        reason: str | None = None,
        *,
        model_sha256: str | None = None,
    ) -> None:
        """The signed closing record ('final' or 'interrupted'); epsilon 0: the ledger
        accounts no release (each device accounts its own DP-SGD). `model_sha256`: the
        published model file's hash, bound to the record where given."""
        if self.ledger.closed:
            return
        fields: dict[str, Any] = {"training_round": training_round, "epsilon": 0.0}
        if reason:
            fields["reason"] = reason
        if model_sha256 is not None:
            fields[MODEL_SHA256] = model_sha256
        self.ledger.close(kind, fields)
