"""The global model of a run (admin: model weights can leak training data)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from fedveil.server.coordinator.routes.deps import ADMIN, ApiError, ServiceDep, run_or_404

router = APIRouter(tags=["runs"])


@router.get(
    "/runs/{run_id}/model",
    summary="Download the global model (admin; safetensors)",
    dependencies=ADMIN,
    response_class=FileResponse,
)
def model(run_id: str, service: ServiceDep) -> FileResponse:
    target = run_or_404(service, run_id) / "model.safetensors"
    if not target.is_file():
        raise ApiError(404, f"run {run_id} has no model yet (no round completed)")
    return FileResponse(
        target, media_type="application/octet-stream", filename=f"fedveil-{run_id}.safetensors"
    )
