"""The model registry: each run's model as a named version, with its privacy model card."""

from fedveil.server.registry.registry import Registry
from fedveil.server.registry.store import (
    PRODUCTION,
    REGISTERED,
    ModelVersion,
    RegistryError,
    default_registry_root,
)

__all__ = [
    "PRODUCTION",
    "REGISTERED",
    "ModelVersion",
    "Registry",
    "RegistryError",
    "default_registry_root",
]
