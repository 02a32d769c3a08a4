"""Run the round engine on Flower's simulation engine (Ray).

The ServerApp runs fedveil's RoundEngine over a FlowerTransport; each virtual
SuperNode runs fedveil's ClientApp, whose client id is its partition id.
Results come back through the ServerApp's closure (it runs in this process).
Ray runs the clients: a fresh local instance, or the cluster `simulation.ray_address`
(or RAY_ADDRESS) names; see simulations/ray_cluster.py.

FEDVEIL_RAY_NODE_LOG=<file>: each client appends "<client id> <round> <Ray node id>" there
for every message it handles (to see where a cluster ran which client).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import ray
from flwr.app import Context
from flwr.simulation import run_simulation
from flwr.superlink.grid import InMemoryGrid

from fedveil.client.flower_client_app import make_client_app
from fedveil.client.runtime import ClientRuntime, IdentitySource
from fedveil.config import RunConfig
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.flower_server_app import FlowerTransport, make_server_app
from fedveil.server.engine.rounds import RoundEngine
from fedveil.simulations.ray_cluster import (
    check_fits,
    client_resources,
    init_ray,
    node_id,
    ray_client_device,
    ray_environment,
)
from fedveil.tasks import make_task

EngineFactory = Callable[[FlowerTransport], RoundEngine]
NODE_LOG_ENV = "FEDVEIL_RAY_NODE_LOG"


class _NodeRecordingRuntime(ClientRuntime):
    """A ClientRuntime that notes the Ray node of every message it handles."""

    node_log: str = ""

    def handle(self, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope:
        with open(self.node_log, "a") as f:  # one short line per write: appends stay whole
            f.write(f"{client_id} {msg.round} {node_id()}\n")
        return super().handle(client_id, msg, state)


class _RuntimeFactory:
    """Picklable: builds the task and client runtime inside each Ray worker."""

    node_log: str = ""  # FEDVEIL_RAY_NODE_LOG: note the Ray node of each message there

    def __init__(self, cfg: RunConfig, identities: IdentitySource | None = None) -> None:
        self.cfg, self.identities = cfg, identities

    def __call__(self) -> ClientRuntime:
        device = ray_client_device(self.cfg.simulation.client_gpus)
        cls = _NodeRecordingRuntime if self.node_log else ClientRuntime
        runtime = cls(make_task(self.cfg), device, self.identities, run_config=self.cfg)
        if self.node_log:
            runtime.node_log = self.node_log  # type: ignore[attr-defined]
        return runtime


class RunStopped(RuntimeError):
    """The run was stopped (a signal, or the simulation engine failed) mid-exchange."""


@contextlib.contextmanager
def _stoppable_grid() -> Iterator[threading.Event]:
    """While the run is on, Flower's in-memory Grid gives up once the event is set.

    The ServerApp runs in a thread of Flower's that nothing can interrupt; its Grid polls for
    replies, so a Grid that checks the event at each poll ends it within one poll interval.
    """
    stop = threading.Event()

    class StoppableGrid(InMemoryGrid):
        def get_node_ids(self) -> Any:
            if stop.is_set():
                raise RunStopped("the run was stopped")
            return super().get_node_ids()

        def pull_messages(self, message_ids: Any) -> Any:
            if stop.is_set():
                raise RunStopped("the run was stopped while waiting for clients")
            return super().pull_messages(message_ids)

    module = _simulation_module_of()
    original = module.InMemoryGrid
    module.InMemoryGrid = StoppableGrid
    try:
        yield stop
    finally:
        module.InMemoryGrid = original


def _simulation_module_of() -> Any:
    import sys

    return sys.modules[run_simulation.__module__]


def _shutdown_ray() -> None:
    import sys

    ray = sys.modules.get("ray")  # interrupted while importing it: nothing to shut down
    if ray is not None and hasattr(ray, "shutdown"):
        with contextlib.suppress(Exception):
            ray.shutdown()


def run_on_flower(
    cfg: RunConfig,
    num_clients: int,
    engine_factory: EngineFactory,
    *,
    verbose: bool = False,
    identities: IdentitySource | None = None,
    runtime_factory: Callable[[], ClientRuntime] | None = None,
) -> dict[str, Any]:
    """Run a whole training run on Flower's simulation engine; returns the summary.
    `identities`: the clients' secure-aggregation identities (malicious mode).
    `runtime_factory`: builds each ClientApp's runtime in its Ray worker (picklable);
    None: fedveil's ClientRuntime for the config's task (benchmarks pass their own)."""
    result: dict[str, Any] = {}

    def main(transport: FlowerTransport, context: Context) -> None:
        engine = engine_factory(transport)
        result["summary"] = engine.run()
        result["engine"] = engine

    server_app = make_server_app(main, expected_clients=num_clients)
    factory: Callable[[], ClientRuntime]
    if runtime_factory is not None:
        factory = runtime_factory
    else:
        factory = _RuntimeFactory(cfg, identities)
        if os.environ.get(NODE_LOG_ENV):
            factory.node_log = os.path.abspath(os.environ[NODE_LOG_ENV])
    client_app = make_client_app(factory)
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.ERROR)
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    with ray_environment(cfg) as address, _stoppable_grid() as stop:
        try:
            init_ray(address, verbose=verbose)
            check_fits(
                ray.cluster_resources(), cfg.simulation.client_cpus, cfg.simulation.client_gpus
            )
            run_simulation(
                server_app=server_app,
                client_app=client_app,
                num_supernodes=num_clients,
                backend_config={"client_resources": client_resources(cfg)},
                verbose_logging=verbose,
            )
        except BaseException:
            # Interrupted (SIGTERM, Ctrl-C) or failed: the ServerApp thread would otherwise
            # wait for replies from clients that are gone, and keep the process alive.
            stop.set()
            _shutdown_ray()
            raise
    if "summary" not in result:
        raise RuntimeError("Flower simulation ended without a result (see the log above)")
    return result
