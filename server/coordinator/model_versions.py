"""The coordinator's model registry (<state-dir>/registry): each completed run's final
model is registered as the next version of its task's name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fedveil.server.registry import Registry
from fedveil.server.registry.divergence import divergence

log = logging.getLogger("fedveil.coordinator")

REGISTRY_DIR = "registry"


def coordinator_registry(state_dir: Path) -> Registry:
    return Registry(Path(state_dir) / REGISTRY_DIR)


def register_finished_run(state_dir: Path, run_dir: Path, record: dict[str, Any]) -> None:
    """Register a completed run's final model; its reference goes into the run's record
    (`model_version`; a record that already names one, e.g. a drift evaluation's, is
    left alone). A run started from a registered version (`drift.parent` in its record)
    carries it as its parent: same devices, so the card sums epsilon over the lineage.
    A run that cannot be registered (e.g. a ledger that fails verification) is logged
    and left unregistered, the reason in `model_version_error`: the run itself stays
    completed. A model at chance level (or with a non-finite loss) is registered with a
    warning, logged and kept in `model_version_warning` (the dashboard marks the run
    diverged): registered, never promoted by this."""
    if record.get("model_version"):
        return
    parent = (record.get("drift") or {}).get("parent")
    try:
        version = coordinator_registry(state_dir).register(run_dir, parent=parent)
    except Exception as error:  # registering must never stop the run supervisor
        log.warning("run %s: model not registered: %s", record.get("id"), error)
        record["model_version_error"] = str(error)
        return
    record["model_version"] = version.ref
    log.info("run %s: model registered as %s", record.get("id"), version.ref)
    why = divergence(version.card)
    if why is not None:
        record["model_version_warning"] = f"the model diverged or learned nothing: {why}"
        log.warning(
            "run %s: %s: %s", record.get("id"), version.ref, record["model_version_warning"]
        )
