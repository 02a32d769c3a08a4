"""The HTTP API (FastAPI): runs, rounds, privacy reports, models, clients, metrics, dashboard.

Reads are open; every mutating endpoint and the model download need the admin
token (routes/deps.py). Bad input is answered with the field at fault: 422 for a
run config or enrollment the service will not accept, 404 for an unknown run,
413 for a body over api.max_body_bytes. None of it reaches a running run.
One router per resource lives in routes/; this module assembles them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedveil import __version__
from fedveil.server.coordinator.gateway import read_body, send_json
from fedveil.server.coordinator.routes import ROUTERS
from fedveil.server.coordinator.routes.deps import ApiError

if TYPE_CHECKING:
    from fedveil.server.coordinator.service import Service

log = logging.getLogger("fedveil.api")

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


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


async def api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    body: dict[str, Any] = {"detail": exc.detail}
    if exc.field:
        body["field"] = exc.field
    headers = {"WWW-Authenticate": 'Bearer realm="fedveil"'} if exc.status == 401 else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 naming the first field at fault (as for run configs), not pydantic's error list."""
    assert isinstance(exc, RequestValidationError)
    request.app.state.service.counters.reject("invalid")
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", []) if p not in ("body", "query", "path")]
    # A body that is not JSON is located at ("body", <character offset>): the field is
    # the body, not a number.
    field = "body" if first.get("type") == "json_invalid" else ".".join(loc) or "body"
    return JSONResponse(
        {"detail": f"{field}: {first.get('msg', 'invalid')}", "field": field}, status_code=422
    )


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


async def security_headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    for k, v in SECURITY_HEADERS.items():
        response.headers.setdefault(k, v)
    return response


def create_api(service: Service) -> FastAPI:
    """The FastAPI app over a running Service (server/coordinator/service.py)."""
    app = FastAPI(
        title="fedveil coordinator",
        version=__version__,
        description="Runs of federated training over Flower's deployment engine: submit, "
        "follow, stop; privacy reports; global models; enrolled clients; Prometheus metrics.",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.service = service  # handlers get it through routes.deps.get_service
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.middleware("http")(security_headers)
    for router in ROUTERS:
        app.include_router(router)
    return app
