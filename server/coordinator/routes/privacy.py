"""A run's privacy report, as JSON or as an inert HTML page."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from fedveil.server.coordinator.routes.deps import ApiError, ServiceDep, run_or_404

router = APIRouter(tags=["runs"])

# Privacy reports are generated files; served inert on the API's origin.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"


def wants_html(request: Request, format: str) -> bool:
    """?format=html, or the default format with a browser's Accept header."""
    accept = request.headers.get("accept", "").split(",")[0]
    return format == "html" or (format == "json" and "text/html" in accept)


@router.get("/runs/{run_id}/privacy", summary="The run's privacy report (JSON or HTML)")
def privacy(run_id: str, request: Request, service: ServiceDep, format: str = "json") -> Response:
    path = run_or_404(service, run_id) / "privacy"
    html = wants_html(request, format)
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
