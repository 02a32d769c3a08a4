"""The drift evaluations a retraining run started from, and what they cost.

When the coordinator retrains a version trained with DP (server/coordinator/drift.py), the
retraining run carries `drift_evaluations.json`: the signed ledgers of that version's drift
evaluations, copied when the retraining run was submitted. Each evaluation released the
devices' noised accuracy and loss (privacy/dp/evaluation.py); the decision to retrain is
post-processing of those releases and costs nothing more, but the retrained model exists
because of them, so the card's composed epsilon must count them.

Reading the file checks every ledger as `fedveil privacy verify` does (signatures, chain,
recomputed epsilon, a final record), that each release is a drift evaluation of the parent
version, and composes all their releases with their own accountant at the largest delta
they state. The figure holds against observers only: the evaluations' noise is central, so
the coordinator (the trusted curator) saw their exact sum.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedveil.privacy.dp import compute_epsilon, event_from_entry, verify_ledger
from fedveil.privacy.dp.evaluation import RELEASE_KIND
from fedveil.privacy.dp.ledger import RELEASE, entry_kind
from fedveil.privacy.dp.verify import STATUS_FINAL
from fedveil.server.registry.store import RegistryError

DRIFT_EVALUATIONS_FILE = "drift_evaluations.json"
SCHEMA = "fedveil.drift_evaluations/1"
COORDINATOR_NOTE = (
    "the drift evaluations' noise is central: the coordinator saw their exact sum, so no "
    "epsilon holds against it for them"
)


def evaluations_record(version: str, ledgers: Sequence[tuple[str, list[dict[str, Any]]]]) -> str:
    """The file's text: the version evaluated and, per evaluation run, its ledger's entries."""
    record = {
        "schema": SCHEMA,
        "version": version,
        "evaluations": [{"run_id": rid, "ledger": entries} for rid, entries in ledgers],
    }
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


def drift_evaluations(run_dir: Path, parent: str | None) -> dict[str, Any] | None:
    """The evaluations `run_dir` started from, checked and composed (None: it carries none).
    RegistryError when the file is unreadable, names another version than `parent`, or
    holds a ledger that does not verify: their cost would then be unknown."""
    path = Path(run_dir) / DRIFT_EVALUATIONS_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RegistryError(f"{path}: unreadable ({error})") from None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise RegistryError(f"{path}: not a {SCHEMA} record")
    if record.get("version") != parent:
        raise RegistryError(
            f"{path}: evaluations of {record.get('version')!r}, but the run's parent is {parent!r}"
        )
    runs, releases = [], []
    for item in record.get("evaluations") or []:
        run_id, entries = _evaluation(item, path)
        releases += _checked_releases(entries, run_id, parent, path)
        runs.append(run_id)
    figures: dict[str, Any] = {"version": parent, "runs": runs, "releases": len(releases)}
    if not releases:
        return figures | {"epsilon": 0.0, "delta": 0.0, "accountant": None}
    accountants = {e["accountant"] for e in releases}
    if len(accountants) != 1:
        raise RegistryError(f"{path}: the evaluations use several accountants {accountants}")
    (accountant,) = accountants
    delta = max(float(e["delta"]) for e in releases)
    try:
        epsilon = compute_epsilon([event_from_entry(e) for e in releases], delta, accountant)
    except ValueError as error:
        raise RegistryError(f"{path}: cannot compose the evaluations ({error})") from None
    return figures | {
        "epsilon": epsilon,
        "delta": delta,
        "accountant": accountant,
        "coordinator": COORDINATOR_NOTE,
    }


def _evaluation(item: Any, path: Path) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(item, Mapping) or not isinstance(item.get("ledger"), list):
        raise RegistryError(f"{path}: an evaluation without its ledger: {item!r}")
    return str(item.get("run_id")), list(item["ledger"])


def _checked_releases(
    entries: list[dict[str, Any]], run_id: str, parent: str | None, path: Path
) -> list[dict[str, Any]]:
    """The ledger's releases, once it verifies as a finished drift evaluation of `parent`."""
    result = verify_ledger(entries)
    if result.status != STATUS_FINAL:
        raise RegistryError(
            f"{path}: evaluation {run_id}'s ledger does not verify as final: {result.message}"
        )
    releases = [e for e in entries if entry_kind(e) == RELEASE]
    for entry in releases:
        if entry.get("release") != RELEASE_KIND or entry.get("model_version") != parent:
            raise RegistryError(
                f"{path}: evaluation {run_id}'s ledger holds a release that is not a drift "
                f"evaluation of {parent!r} (release={entry.get('release')!r}, "
                f"model_version={entry.get('model_version')!r})"
            )
    return releases
