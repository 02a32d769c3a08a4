"""The drift monitor's state: the evaluation in flight and each past evaluation's outcome."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from fedveil.server.coordinator.routes.deps import ADMIN, ServiceDep

router = APIRouter(tags=["drift"])


@router.get("/drift", summary="Drift evaluations and retraining ([drift])", dependencies=ADMIN)
def drift(service: ServiceDep) -> dict[str, Any]:
    return service.drift.state()
