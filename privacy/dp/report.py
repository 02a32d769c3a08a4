"""report.json: the run's final privacy guarantee and its per-round series."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .assumptions import assumptions_for
from .config import DpConfig
from .ledger import GENESIS_HASH
from .verify import VerifyResult

REPORT_SCHEMA = "fedveil.dp.report/1"
_SERIES_FIELDS = (
    "round",
    "epsilon",
    "clip_norm",
    "noise_multiplier",
    "cohort_planned",
    "cohort_aggregated",
)


def build_report(
    ledger_entries: Iterable[Mapping[str, Any]],
    *,
    config: DpConfig | None = None,
    verification: VerifyResult | None = None,
    secure_aggregation: str | None = None,
) -> dict[str, Any]:
    """Summarise ledger entries (JSON-serialisable dict).

    `config` fills in the run's parameters when no round was released yet.
    `verification` (from verify_ledger) is embedded so a reader sees whether the
    numbers were recomputed independently. `secure_aggregation` ("off", "semi_honest",
    "malicious"), when known, adds how updates travelled to the trust assumptions.
    """
    entries = [dict(entry) for entry in ledger_entries]
    if not entries and config is None:
        raise ValueError("build_report needs at least one ledger entry or a config")
    last = entries[-1] if entries else _entry_from_config(config)  # type: ignore[arg-type]
    epsilon = float(last["epsilon"]) if entries else 0.0
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "epsilon": epsilon,
        "delta": last["delta"],
        "budget_epsilon": last["budget_epsilon"],
        "budget_remaining": max(0.0, float(last["budget_epsilon"]) - epsilon),
        "mechanism": last["mechanism"],
        "sampling": last["sampling"],
        "sampling_rate": last["sampling_rate"],
        "privacy_unit": last["privacy_unit"],
        "neighbouring": last["neighbouring"],
        "accountant": last["accountant"],
        "rounds": len(entries),
        "ledger_entries": len(entries),
        "ledger_head_hash": entries[-1]["hash"] if entries else GENESIS_HASH,
        "series": {name: [entry[name] for entry in entries] for name in _SERIES_FIELDS},
        "assumptions": assumptions_for(
            last["mechanism"],
            last["privacy_unit"],
            last["neighbouring"],
            last["sampling"],
            epsilon,
            last["delta"],
            secure_aggregation,
        ),
    }
    if secure_aggregation is not None:
        report["secure_aggregation"] = secure_aggregation
    if verification is not None:
        report["verification"] = {
            "ok": verification.ok,
            "message": verification.message,
            "line": verification.line,
            "epsilon_recomputed": verification.epsilon_recomputed,
            "recomputed_epsilon": verification.final_epsilon,
        }
    return report


def _entry_from_config(config: DpConfig) -> dict[str, Any]:
    return {
        "delta": config.delta,
        "budget_epsilon": config.budget_epsilon,
        "mechanism": config.mechanism,
        "sampling": config.sampling,
        "sampling_rate": config.sampling_rate,
        "privacy_unit": config.privacy_unit,
        "neighbouring": config.neighbouring,
        "accountant": config.accountant_name,
    }
