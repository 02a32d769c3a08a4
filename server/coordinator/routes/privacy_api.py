"""A run's privacy report, as JSON or as an inert HTML page: the public one, and the
operator's (admin token), which marks what only the private annex shows."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from fedveil.server.coordinator.routes.deps import ADMIN, ApiError, ServiceDep, run_or_404

router = APIRouter(tags=["runs"])

# Privacy reports are generated files; served inert on the API's origin.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"


def wants_html(request: Request, format: str) -> bool:
    """?format=html, or the default format with a browser's Accept header."""
    accept = request.headers.get("accept", "").split(",")[0]
    return format == "html" or (format == "json" and "text/html" in accept)


@router.get("/runs/{run_id}/privacy", summary="The run's privacy report (JSON or HTML)")
def privacy(run_id: str, request: Request, service: ServiceDep, format: str = "json") -> Response:
    return _report(run_or_404(service, run_id) / "privacy", run_id, request, format)


@router.get(
    "/runs/{run_id}/privacy/private",
    summary="The operator's privacy report: noise-only rounds marked (admin; JSON or HTML)",
    dependencies=ADMIN,
)
def privacy_private(
    run_id: str, request: Request, service: ServiceDep, format: str = "json"
) -> Response:
    return _report(run_or_404(service, run_id) / "private", run_id, request, format)


def _report(folder: Path, run_id: str, request: Request, format: str) -> Response:
    if format not in ("json", "html"):
        raise ApiError(422, "format: must be json or html", "format")
    html = wants_html(request, format)
    target = folder / ("report.html" if html else "report.json")
    if not target.is_file():
        raise ApiError(
            404, f"run {run_id} has no privacy report ({target.name}); DP is off or pending"
        )
    if html:
        return FileResponse(
            target, media_type="text/html", headers={"Content-Security-Policy": REPORT_CSP}
        )
    return FileResponse(target, media_type="application/json")
