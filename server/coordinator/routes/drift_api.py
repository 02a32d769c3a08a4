"""The drift monitor's state: the evaluation in flight and each past evaluation's outcome.

Public, as the runs list is (the dashboard reads it). For a version trained without DP it
shows the federated accuracy, which its runs publish anyway; for a DP version only what
the evaluation released under the accounting: the noised mean accuracy and loss, each
evaluation's epsilon and the version's budget spent and left, and (`devices`) the
most-charged enrolled device's epsilon across every version against drift.device_budget
(server/coordinator/drift_devices.py); never a device id or a count of devices
(those are in the evaluation run's private annex). Server paths are left out, as in every
public view.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from fedveil.server.coordinator.routes.deps import ServiceDep
from fedveil.server.coordinator.runs import without_paths

router = APIRouter(tags=["drift"])


@router.get("/drift", summary="Drift evaluations and retraining ([drift] in server.toml)")
def drift(service: ServiceDep) -> dict[str, Any]:
    return without_paths(service.drift.state())  # type: ignore[no-any-return]
