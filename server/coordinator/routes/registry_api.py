"""The model registry: names, versions and their model cards (read routes: public, with
the server's paths for the admin token only, as the runs' views)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from fedveil.server.coordinator.model_versions import coordinator_registry
from fedveil.server.coordinator.routes.deps import ApiError, ServiceDep
from fedveil.server.coordinator.routes.runs_api import is_admin
from fedveil.server.coordinator.runs import without_paths
from fedveil.server.registry import ModelVersion, RegistryError

router = APIRouter(tags=["models"])


@router.get("/models", summary="Registered models, their versions and the promoted one")
def list_models(service: ServiceDep) -> list[dict[str, Any]]:
    registry = coordinator_registry(service.manager.state_dir)
    out = []
    for name in registry.names():
        promoted = registry.promoted(name)
        out.append(
            {
                "name": name,
                "promoted": None if promoted is None else promoted.version,
                "versions": [_summary(v) for v in registry.versions(name)],
            }
        )
    return out


@router.get(
    "/models/{name}/versions/{version}",
    summary="A version's model card (the run's server path: admin token)",
)
def get_version(name: str, version: int, request: Request, service: ServiceDep) -> dict[str, Any]:
    registry = coordinator_registry(service.manager.state_dir)
    try:
        found = registry.get(name, version)
    except RegistryError as error:
        service.counters.reject("not_found")
        raise ApiError(404, str(error)) from None
    card = {**found.card, "stage": found.stage}
    return card if is_admin(request, service) else without_paths(_public(card))


def _summary(version: ModelVersion) -> dict[str, Any]:
    card = version.card
    privacy = card.get("privacy") or {}
    return {
        "version": version.version,
        "stage": version.stage,
        "task": version.task,
        "model": version.model,
        "rounds": card.get("rounds"),
        "test_accuracy": (card.get("central_evaluation") or {}).get("test_accuracy"),
        "dp": privacy.get("dp"),
        "epsilon": privacy.get("epsilon"),
        "delta": privacy.get("delta"),
        "registered_at": card.get("registered_at"),
    }


def _public(card: dict[str, Any]) -> dict[str, Any]:
    source = {k: v for k, v in (card.get("source") or {}).items() if k != "run_dir"}
    return {**card, "source": source}
