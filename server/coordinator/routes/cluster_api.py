"""The SuperLink and how many clients are connected to it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from fedveil.server.coordinator.routes.deps import ServiceDep

router = APIRouter(tags=["clients"])


@router.get("/cluster", summary="SuperLink and connected clients")
def cluster(service: ServiceDep) -> dict[str, Any]:
    return {
        "superlink": "up" if service.superlink_up() else "down",
        # Only nodes mapped to an enrolled client id count as connected clients.
        "clients_connected": service.clients_connected(),
        "nodes_unmapped": service.nodes_unmapped(),
        "client_auth": service.settings.client_auth,
        "tls": not service.settings.tls.insecure,
    }
