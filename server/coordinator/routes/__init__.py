"""The HTTP API's routers, one per resource, in the order they are mounted."""

from __future__ import annotations

from fastapi import APIRouter

from fedveil.server.coordinator.routes import (
    clients,
    cluster,
    dashboard,
    drift,
    health,
    models,
    privacy,
    registry,
    rounds,
    runs,
)

ROUTERS: list[APIRouter] = [
    health.router,
    runs.router,
    rounds.router,
    privacy.router,
    models.router,
    registry.router,
    cluster.router,
    clients.router,
    drift.router,
    dashboard.router,
]
