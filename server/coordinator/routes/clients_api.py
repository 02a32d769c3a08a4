"""Enrolled client keys: list, enroll, revoke (all admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from fedveil.server.coordinator.clients import EnrollError
from fedveil.server.coordinator.routes.deps import ADMIN, ApiError, ServiceDep

router = APIRouter(tags=["clients"], dependencies=ADMIN)


class Enrollment(BaseModel):
    client_id: int = Field(..., ge=0, lt=1_000_000, description="the client's id in the population")
    public_key: str = Field(..., max_length=4096, description="OpenSSH ECDSA public key line")
    name: str | None = Field(None, max_length=100)


@router.get("/clients", summary="Enrolled clients (admin)")
def clients(service: ServiceDep) -> list[dict[str, Any]]:
    online = service.online_nodes()
    return [
        {
            "client_id": cid,
            "name": r["name"],
            "fingerprint": r["fingerprint"],
            "enrolled_at": r["enrolled_at"],
            "revoked_at": r.get("revoked_at"),
            "online": int(r["node_id"]) in online,
        }
        for cid, r in sorted(service.registry.all().items())
    ]


@router.post("/clients", status_code=201, summary="Enroll a client key (admin)")
def enroll(body: Enrollment, service: ServiceDep) -> JSONResponse:
    if not service.settings.client_auth:
        raise ApiError(
            409, "client authentication is off (--insecure): nothing to enroll", "public_key"
        )
    try:
        r = service.registry.enroll(service.link, body.client_id, body.public_key, body.name)
    except EnrollError as exc:
        service.counters.reject("invalid" if exc.status == 422 else "conflict")
        raise ApiError(exc.status, str(exc), exc.field) from None
    return JSONResponse(
        {k: r[k] for k in ("client_id", "name", "fingerprint", "enrolled_at")}, status_code=201
    )


@router.delete("/clients/{client_id}", summary="Revoke a client key (admin)")
def revoke(client_id: int, service: ServiceDep) -> dict[str, Any]:
    try:
        r = service.registry.revoke(service.link, client_id)
    except EnrollError as exc:
        raise ApiError(exc.status, str(exc), exc.field) from None
    return {k: r[k] for k in ("client_id", "name", "fingerprint", "revoked_at")}
