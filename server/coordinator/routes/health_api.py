"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from fedveil.server.coordinator.metrics import render
from fedveil.server.coordinator.routes.deps import ServiceDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="SuperLink up and runs supervised")
def readyz(service: ServiceDep) -> JSONResponse:
    problems = service.readiness_problems()
    body = {"ready": not problems, "problems": problems}
    return JSONResponse(body, status_code=200 if not problems else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
def metrics(service: ServiceDep) -> PlainTextResponse:
    manager = service.manager
    runs = manager.list()
    dirs = {r["id"]: manager.rundir(r["id"]).path for r in runs}
    text = render(
        runs,
        dirs,
        service.rounds_cache,
        service.counters,
        service.clients_connected(),
        service.superlink_up(),
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
