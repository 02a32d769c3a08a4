"""The drift monitor's state: the evaluation in flight and each past evaluation's outcome.

Public, as the runs list is (the dashboard reads it): drift evaluations only run for
versions trained without DP, whose federated accuracy a run publishes anyway; a DP
version's entry is the refusal alone. Server paths are left out, as in every public view.
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
