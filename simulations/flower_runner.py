"""Run the round engine on Flower's simulation engine (Ray).

The ServerApp runs fedveil's RoundEngine over a FlowerTransport; each virtual
SuperNode runs fedveil's ClientApp, whose client id is its partition id.
Results come back through the ServerApp's closure (it runs in this process).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from flwr.app import Context
from flwr.simulation import run_simulation

from fedveil.client.flower_app import make_client_app
from fedveil.client.runtime import ClientRuntime, IdentitySource
from fedveil.config import RunConfig
from fedveil.server.engine.flower_app import FlowerTransport, make_server_app
from fedveil.server.engine.rounds import RoundEngine
from fedveil.tasks import make_task

EngineFactory = Callable[[FlowerTransport], RoundEngine]


class _RuntimeFactory:
    """Picklable: builds the task and client runtime inside each Ray worker."""

    def __init__(self, cfg: RunConfig, identities: IdentitySource | None = None) -> None:
        self.cfg, self.identities = cfg, identities

    def __call__(self) -> ClientRuntime:
        return ClientRuntime(make_task(self.cfg), "cpu", self.identities, run_config=self.cfg)


def run_on_flower(
    cfg: RunConfig,
    num_clients: int,
    engine_factory: EngineFactory,
    *,
    num_cpus_per_client: float = 1.0,
    verbose: bool = False,
    identities: IdentitySource | None = None,
) -> dict[str, Any]:
    """Run a whole training run on Flower's simulation engine; returns the summary.
    `identities`: the clients' secure-aggregation identities (malicious mode)."""
    result: dict[str, Any] = {}

    def main(transport: FlowerTransport, context: Context) -> None:
        engine = engine_factory(transport)
        result["summary"] = engine.run()
        result["engine"] = engine

    server_app = make_server_app(main, expected_clients=num_clients)
    client_app = make_client_app(_RuntimeFactory(cfg, identities))
    backend_config = {
        "client_resources": {"num_cpus": num_cpus_per_client, "num_gpus": 0.0},
        "init_args": {
            "log_to_driver": verbose,
            "logging_level": "error" if not verbose else "info",
        },
    }
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.ERROR)
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_clients,
        backend_config=backend_config,
        verbose_logging=verbose,
    )
    if "summary" not in result:
        raise RuntimeError("Flower simulation ended without a result (see the log above)")
    return result
