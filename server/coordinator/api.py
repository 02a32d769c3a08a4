"""The HTTP API (FastAPI): runs, rounds, privacy reports, models, clients, metrics, dashboard.

Reads are open; every mutating endpoint and the model download need the admin
token (auth.py). Bad input is answered with the field at fault: 422 for a run
config or enrollment the service will not accept, 404 for an unknown run, 413
for a body over api.max_body_bytes. None of it reaches a running run.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedveil import __version__
from fedveil.server.coordinator.clients import EnrollError
from fedveil.server.coordinator.gateway import read_body, send_json
from fedveil.server.coordinator.metrics import render
from fedveil.server.coordinator.runs import RunConflict, RunNotFound, SubmissionError

log = logging.getLogger("fedveil.api")

STATIC = resources.files("fedveil.server.coordinator") / "static"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# Privacy reports are generated files; served inert on the API's origin.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"


class ApiError(Exception):
    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


class Enrollment(BaseModel):
    client_id: int = Field(..., ge=0, lt=1_000_000, description="the client's id in the population")
    public_key: str = Field(..., max_length=4096, description="OpenSSH ECDSA public key line")
    name: str | None = Field(None, max_length=100)


class BodyLimit:
    """Refuse request bodies over `limit` bytes with 413 before any handler reads them."""

    def __init__(self, app: Any, limit: int, counters: Any) -> None:
        self.app, self.limit, self.counters = app, limit, counters

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        body = await read_body(scope, receive, self.limit)
        if body is None:
            self.counters.reject("too_large")
            await send_json(
                send, 413, f"request body over the {self.limit}-byte limit (api.max_body_bytes)"
            )
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def create_api(service: Any) -> FastAPI:
    """The FastAPI app over a running Service (server/coordinator/main.py)."""
    app = FastAPI(
        title="fedveil coordinator",
        version=__version__,
        description="Runs of federated training over Flower's deployment engine: submit, "
        "follow, stop; privacy reports; global models; enrolled clients; Prometheus metrics.",
        docs_url="/docs",
        redoc_url=None,
    )
    manager, counters = service.manager, service.counters

    def admin(request: Request) -> None:
        code = service.token.check(request.headers.get("authorization"))
        if code == 401:
            counters.reject("unauthorized")
            raise ApiError(401, "admin token required: send 'Authorization: Bearer <token>'")
        if code == 403:
            counters.reject("forbidden")
            raise ApiError(403, "admin token not accepted")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        body: dict[str, Any] = {"detail": exc.detail}
        if exc.field:
            body["field"] = exc.field
        headers = {"WWW-Authenticate": 'Bearer realm="fedveil"'} if exc.status == 401 else None
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        counters.reject("invalid")
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", []) if p not in ("body", "query", "path")]
        field = ".".join(loc) or "body"
        return JSONResponse(
            {"detail": f"{field}: {first.get('msg', 'invalid')}", "field": field}, status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        for k, v in SECURITY_HEADERS.items():
            response.headers.setdefault(k, v)
        return response

    def run_or_404(run_id: str) -> Path:
        try:
            return manager.rundir(run_id).path
        except RunNotFound:
            counters.reject("not_found")
            raise ApiError(404, f"no run {run_id!r}") from None

    # -- health -------------------------------------------------------------
    @app.get("/healthz", tags=["health"], summary="The process is up")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="SuperLink up and runs supervised")
    def readyz() -> JSONResponse:
        problems = service.readiness_problems()
        body = {"ready": not problems, "problems": problems}
        return JSONResponse(body, status_code=200 if not problems else 503)

    @app.get(
        "/metrics", tags=["health"], summary="Prometheus metrics", response_class=PlainTextResponse
    )
    def metrics() -> PlainTextResponse:
        runs = manager.list()
        dirs = {r["id"]: manager.rundir(r["id"]).path for r in runs}
        text = render(
            runs,
            dirs,
            service.rounds_cache,
            counters,
            service.clients_connected(),
            service.superlink_up(),
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- runs ---------------------------------------------------------------
    @app.get("/runs", tags=["runs"], summary="All runs, newest first")
    def list_runs() -> list[dict[str, Any]]:
        return manager.list()

    @app.post(
        "/runs",
        tags=["runs"],
        status_code=201,
        summary="Submit a run (admin)",
        dependencies=[Depends(admin)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": "A fedveil run config (as for `fedveil simulate --config`) plus an "
                "optional [deploy] table: name, wait_for_clients, wait_timeout_s.",
                "content": {
                    "application/toml": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "object"}},
                },
            }
        },
    )
    async def submit(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            run = manager.submit(body, request.headers.get("content-type", ""))
        except SubmissionError as exc:
            counters.reject("invalid")
            raise ApiError(422, str(exc), exc.field) from None
        return JSONResponse(run, status_code=201, headers={"Location": f"/runs/{run['id']}"})

    @app.get("/runs/{run_id}", tags=["runs"], summary="A run's status and progress")
    def get_run(run_id: str) -> dict[str, Any]:
        run_or_404(run_id)
        return manager.view(run_id)

    @app.post(
        "/runs/{run_id}/stop",
        tags=["runs"],
        summary="Stop a run (admin)",
        dependencies=[Depends(admin)],
    )
    def stop_run(run_id: str) -> dict[str, Any]:
        run_or_404(run_id)
        try:
            return manager.stop(run_id)
        except RunConflict as exc:
            raise ApiError(409, str(exc)) from None

    @app.get("/runs/{run_id}/rounds", tags=["runs"], summary="Per-round records (metrics.jsonl)")
    def rounds(run_id: str, since: int = 0) -> list[dict[str, Any]]:
        run_or_404(run_id)
        return [r for r in manager.rundir(run_id).metrics() if int(r.get("round", 0)) > since]

    @app.get(
        "/runs/{run_id}/privacy", tags=["runs"], summary="The run's privacy report (JSON or HTML)"
    )
    def privacy(run_id: str, request: Request, format: str = "json") -> Response:
        path = run_or_404(run_id) / "privacy"
        html = format == "html" or (
            format == "json" and "text/html" in request.headers.get("accept", "").split(",")[0]
        )
        if format not in ("json", "html"):
            raise ApiError(422, "format: must be json or html", "format")
        target = path / ("report.html" if html else "report.json")
        if not target.is_file():
            raise ApiError(
                404, f"run {run_id} has no privacy report ({target.name}); DP is off or pending"
            )
        if html:
            return FileResponse(
                target, media_type="text/html", headers={"Content-Security-Policy": REPORT_CSP}
            )
        return FileResponse(target, media_type="application/json")

    @app.get(
        "/runs/{run_id}/model",
        tags=["runs"],
        summary="Download the global model (admin; safetensors)",
        dependencies=[Depends(admin)],
        response_class=FileResponse,
    )
    def model(run_id: str) -> FileResponse:
        target = run_or_404(run_id) / "model.safetensors"
        if not target.is_file():
            raise ApiError(404, f"run {run_id} has no model yet (no round completed)")
        return FileResponse(
            target, media_type="application/octet-stream", filename=f"fedveil-{run_id}.safetensors"
        )

    # -- clients ------------------------------------------------------------
    @app.get("/cluster", tags=["clients"], summary="SuperLink and connected clients")
    def cluster() -> dict[str, Any]:
        return {
            "superlink": "up" if service.superlink_up() else "down",
            "clients_connected": service.clients_connected(),
            "client_auth": service.settings.client_auth,
            "tls": not service.settings.tls.insecure,
        }

    @app.get(
        "/clients",
        tags=["clients"],
        summary="Enrolled clients (admin)",
        dependencies=[Depends(admin)],
    )
    def clients() -> list[dict[str, Any]]:
        online = service.online_nodes()
        out = []
        for cid, r in sorted(service.registry.all().items()):
            out.append(
                {
                    "client_id": cid,
                    "name": r["name"],
                    "fingerprint": r["fingerprint"],
                    "enrolled_at": r["enrolled_at"],
                    "revoked_at": r.get("revoked_at"),
                    "online": int(r["node_id"]) in online,
                }
            )
        return out

    @app.post(
        "/clients",
        tags=["clients"],
        status_code=201,
        summary="Enroll a client key (admin)",
        dependencies=[Depends(admin)],
    )
    def enroll(body: Enrollment) -> JSONResponse:
        if not service.settings.client_auth:
            raise ApiError(
                409, "client authentication is off (--insecure): nothing to enroll", "public_key"
            )
        try:
            r = service.registry.enroll(service.link, body.client_id, body.public_key, body.name)
        except EnrollError as exc:
            counters.reject("invalid" if exc.status == 422 else "conflict")
            raise ApiError(exc.status, str(exc), exc.field) from None
        return JSONResponse(
            {k: r[k] for k in ("client_id", "name", "fingerprint", "enrolled_at")}, status_code=201
        )

    @app.delete(
        "/clients/{client_id}",
        tags=["clients"],
        summary="Revoke a client key (admin)",
        dependencies=[Depends(admin)],
    )
    def revoke(client_id: int) -> dict[str, Any]:
        try:
            r = service.registry.revoke(service.link, client_id)
        except EnrollError as exc:
            raise ApiError(exc.status, str(exc), exc.field) from None
        return {k: r[k] for k in ("client_id", "name", "fingerprint", "revoked_at")}

    # -- dashboard ----------------------------------------------------------
    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    @app.get("/dashboard", include_in_schema=False)
    def dashboard() -> Response:
        html = (STATIC / "dashboard.html").read_bytes()
        return Response(
            html, media_type="text/html", headers={"Content-Security-Policy": DASHBOARD_CSP}
        )

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        kinds = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        suffix = Path(name).suffix
        if "/" in name or name.startswith(".") or suffix not in kinds:
            raise ApiError(404, "not found")
        target = STATIC / name
        if not target.is_file():
            raise ApiError(404, "not found")
        return Response(target.read_bytes(), media_type=kinds[suffix])

    return app
