"""The HTTP API's routers, one per resource, in the order they are mounted."""

from __future__ import annotations

from fastapi import APIRouter

from fedveil.server.coordinator.routes import (
    clients_api,
    cluster_api,
    dashboard_api,
    drift_api,
    health_api,
    models_api,
    privacy_api,
    registry_api,
    rounds_api,
    runs_api,
)

ROUTERS: list[APIRouter] = [
    health_api.router,
    runs_api.router,
    rounds_api.router,
    privacy_api.router,
    models_api.router,
    registry_api.router,
    cluster_api.router,
    clients_api.router,
    drift_api.router,
    dashboard_api.router,
]
