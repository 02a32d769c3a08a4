"""The privacy budget of drift evaluations, per watched version (versions trained with DP).

Each DP evaluation of a version is charged before its run is submitted: a reservation in
the drift state (`charges`, written to disk before the run exists). When the run ends the
charge is settled from the run's signed ledger: kept, with the ledger's own figures, when it
holds a release (the sum was unmasked: charged even if nothing was published), refunded when
it holds none (secure aggregation stopped before unmasking, so nothing of the devices' data
left them unmasked, or the run never started). A ledger that cannot be read keeps its charge.
The version's spent epsilon is the accountant's composition of its kept charges
(privacy/dp/evaluation.composed_epsilon), at drift.delta.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fedveil.privacy.dp.evaluation import EvaluationPlan, composed_epsilon, evaluation_event
from fedveil.privacy.dp.ledger import RELEASE, LedgerCorruptError, entry_kind, parse_ledger_bytes
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.server.engine.privacy_report import ledger_path

log = logging.getLogger("fedveil.drift")

RESERVED, CHARGED, REFUNDED = "reserved", "charged", "refunded"
COUNTED = (RESERVED, CHARGED)


class DriftBudget:
    """The `charges` of a drift state (modified in place: the caller writes the state)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.charges: dict[str, list[dict[str, Any]]] = state.setdefault("charges", {})

    def counted(self, ref: str) -> list[dict[str, Any]]:
        """The version's charges that count: reserved (in flight) and kept."""
        return [c for c in self.charges.get(ref, []) if c.get("status") in COUNTED]

    def spent(self, ref: str, delta: float, plus: EvaluationPlan | None = None) -> float:
        """The version's composed epsilon at `delta` (with one more evaluation `plus`)."""
        events = [evaluation_event(float(c["noise_multiplier"])) for c in self.counted(ref)]
        return composed_epsilon([*events, *([plus.event()] if plus else [])], delta)

    def prior(self, ref: str) -> list[float]:
        """The noise multipliers of the version's counted evaluations (what the evaluation
        run composes its own with, before it unmasks)."""
        return [float(c["noise_multiplier"]) for c in self.counted(ref)]

    def reserve(
        self, ref: str, plan: EvaluationPlan, at: float, devices: list[int] | None = None
    ) -> dict[str, Any]:
        """`devices`: the enrolled devices the evaluation could ask (None: every device),
        which drift_devices.py charges it to across versions."""
        charge = {
            "run_id": None,
            "status": RESERVED,
            "at": at,
            "noise_multiplier": plan.noise_multiplier,
            "epsilon": plan.epsilon,
            "delta": plan.delta,
            "devices": devices,
        }
        self.charges.setdefault(ref, []).append(charge)
        return charge

    def cancel(self, ref: str, charge: dict[str, Any]) -> None:
        """A reservation whose run was never created (the submission was refused)."""
        self.charges[ref] = [c for c in self.charges.get(ref, []) if c is not charge]

    def settle(self, ref: str, run_id: str, run_dir: Path | None) -> dict[str, Any] | None:
        """Keep or refund run `run_id`'s charge from its ledger; the charge (None: none)."""
        charge = next((c for c in self.charges.get(ref, []) if c.get("run_id") == run_id), None)
        if charge is None or charge.get("status") != RESERVED:
            return charge
        path = ledger_path(run_dir) if run_dir is not None else None
        try:
            data = path.read_bytes() if path is not None and path.exists() else b""
            entries, _ = parse_ledger_bytes(data)
        except (OSError, LedgerCorruptError) as error:
            charge.update(status=CHARGED, note=f"ledger unreadable, charge kept: {error}")
            return charge
        releases = [e for e in entries if entry_kind(e) == RELEASE]
        if not releases:
            charge.update(status=REFUNDED, note="nothing unmasked: nothing released")
            return charge
        charge["status"] = CHARGED
        # The ledger's own figures; the smallest z of reservation and ledger composes (one
        # release per evaluation: a ledger that differs from the plan never lowers a charge).
        charge["noise_multiplier"] = min(
            [float(charge["noise_multiplier"]), *(float(e["noise_multiplier"]) for e in releases)]
        )
        charge["epsilon"] = float(releases[-1]["epsilon"])
        result = verify_ledger(path)  # type: ignore[arg-type]
        if not result.ok:
            charge["note"] = f"ledger fails verification, charge kept: {result.message}"
            log.warning("drift: evaluation %s: %s", run_id, charge["note"])
        return charge

    def ledgers(self, ref: str, runs_dir: Path) -> list[tuple[str, list[dict[str, Any]]]]:
        """The kept evaluations' ledgers (run id, entries), for a retraining run to carry.
        OSError/ValueError when one is gone or unreadable: the retrain's card could not
        count its cost, so it is not submitted."""
        out = []
        for charge in self.charges.get(ref, []):
            if charge.get("status") != CHARGED:
                continue
            run_id = str(charge["run_id"])
            entries, tail = parse_ledger_bytes(ledger_path(runs_dir / run_id).read_bytes())
            if tail:
                raise ValueError(f"evaluation {run_id}: its ledger ends with a partial line")
            out.append((run_id, entries))
        return out
