"""What every router shares: the running Service, the admin-token check, API errors.

The Service is put on `app.state.service` by `create_api`; handlers receive it
as a FastAPI dependency, so routers are plain module-level objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from fedveil.server.coordinator.runs import RunNotFound

if TYPE_CHECKING:
    from fedveil.server.coordinator.service import Service


class ApiError(Exception):
    """An error answered as {"detail", "field"?} with `status` (api.py installs the handler)."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


async def get_service(request: Request) -> Service:
    return request.app.state.service  # type: ignore[no-any-return]


ServiceDep = Annotated["Service", Depends(get_service)]


def require_admin(request: Request) -> None:
    """Dependency of every mutating endpoint and the model download: a valid admin token."""
    service: Service = request.app.state.service
    code = service.token.check(request.headers.get("authorization"))
    if code == 401:
        service.counters.reject("unauthorized")
        raise ApiError(401, "admin token required: send 'Authorization: Bearer <token>'")
    if code == 403:
        service.counters.reject("forbidden")
        raise ApiError(403, "admin token not accepted")


ADMIN = [Depends(require_admin)]


def run_or_404(service: Service, run_id: str) -> Path:
    """The run's directory, or 404 (counted as a refused request)."""
    try:
        return service.manager.rundir(run_id).path
    except RunNotFound:
        service.counters.reject("not_found")
        raise ApiError(404, f"no run {run_id!r}") from None
