"""The dashboard page and its static files (kept out of the OpenAPI schema)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from fedveil.server.coordinator.routes.deps import ApiError

router = APIRouter(include_in_schema=False)

STATIC = resources.files("fedveil.server.coordinator") / "static"
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard")
@router.get("/dashboard/runs/{run_id}")  # one run's own URL: the same page, selecting it
def dashboard() -> Response:
    html = (STATIC / "dashboard.html").read_bytes()
    return Response(
        html, media_type="text/html", headers={"Content-Security-Policy": DASHBOARD_CSP}
    )


@router.get("/static/{name}")
def static(name: str) -> Response:
    suffix = Path(name).suffix
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise ApiError(404, "not found")
    target = STATIC / name
    if not target.is_file():
        raise ApiError(404, "not found")
    return Response(target.read_bytes(), media_type=STATIC_TYPES[suffix])
