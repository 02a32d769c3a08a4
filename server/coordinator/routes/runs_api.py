"""Runs: submit, list, follow, stop (per-round records: rounds.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from fedveil.server.coordinator.routes.deps import ADMIN, ApiError, ServiceDep, run_or_404
from fedveil.server.coordinator.runs import RunConflict, SubmissionError

if TYPE_CHECKING:
    from fedveil.server.coordinator.service import Service

router = APIRouter(tags=["runs"])

SUBMISSION_BODY = {
    "requestBody": {
        "required": True,
        "description": "A fedveil run config (as for `fedveil simulate --config`) plus an "
        "optional [deploy] table: name, wait_for_clients, wait_timeout_s.",
        "content": {
            "application/toml": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


def is_admin(request: Request, service: Service) -> bool:
    """Whether the request carries a valid admin token (public views otherwise; never an error)."""
    return service.token.check(request.headers.get("authorization")) == 200


@router.get("/runs", summary="All runs, newest first (server paths for the admin token only)")
def list_runs(request: Request, service: ServiceDep) -> list[dict[str, Any]]:
    return service.manager.list(admin=is_admin(request, service))


@router.post(
    "/runs",
    status_code=201,
    summary="Submit a run (admin)",
    dependencies=ADMIN,
    openapi_extra=SUBMISSION_BODY,
)
async def submit(request: Request, service: ServiceDep) -> JSONResponse:
    body = await request.body()
    try:
        run = service.manager.submit(body, request.headers.get("content-type", ""))
    except SubmissionError as exc:
        service.counters.reject("invalid")
        raise ApiError(422, str(exc), exc.field) from None
    return JSONResponse(run, status_code=201, headers={"Location": f"/runs/{run['id']}"})


@router.get("/runs/{run_id}", summary="A run's status and progress (full error: admin token)")
def get_run(run_id: str, request: Request, service: ServiceDep) -> dict[str, Any]:
    run_or_404(service, run_id)
    return service.manager.view(run_id, admin=is_admin(request, service))


@router.post("/runs/{run_id}/stop", summary="Stop a run (admin)", dependencies=ADMIN)
def stop_run(run_id: str, service: ServiceDep) -> dict[str, Any]:
    run_or_404(service, run_id)
    try:
        return service.manager.stop(run_id)
    except RunConflict as exc:
        raise ApiError(409, str(exc)) from None


MAX_LOG_LINES = 10_000


@router.get(
    "/runs/{run_id}/logs",
    summary="The last lines of the run's server log (admin; text)",
    dependencies=ADMIN,
    response_class=PlainTextResponse,
)
def run_logs(run_id: str, service: ServiceDep, tail: int = 200) -> PlainTextResponse:
    # Admin only: a server log names clients and their errors, which DP's public views
    # withhold.
    run_or_404(service, run_id)
    if not 1 <= tail <= MAX_LOG_LINES:
        raise ApiError(422, f"tail = {tail}: must be in [1, {MAX_LOG_LINES}]", "tail")
    return PlainTextResponse(service.manager.log_tail(run_id, tail))
