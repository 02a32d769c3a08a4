"""The contract between the coordinator's FAB and the device's ClientApp.

The coordinator builds the FAB every run is submitted with; a device runs only
runs of that FAB, with its own installed ClientApp. Both read these names here,
so neither imports the other.
"""

from __future__ import annotations

FAB_ID = "fedveil/fedveil-service"
# The installed ClientApp and ServerApp the FAB names (module:attribute); they must
# name the modules that define `app`.
CLIENTAPP_REF = "fedveil.client.edge.device_app:app"
SERVERAPP_REF = "fedveil.server.coordinator.server_app:app"
# Keys of Flower's run config.
CONFIG_KEY = "fedveil-config"  # the run's client-facing config (TOML)
RUN_ID_KEY = "fedveil-run-id"  # the coordinator's run id
