"""`fedveil simulate`: one run, start to finish, into a run directory."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig, to_toml
from fedveil.privacy.secagg.identity import DerivedIdentities
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.rounds import RoundEngine, RoundRecord
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.availability import DROPPED, LATE, AvailabilityModel, AvailabilityTransport
from fedveil.simulations.plots import PLOTS
from fedveil.tasks import Task, make_task

log = logging.getLogger("fedveil.simulate")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device = 'cuda': no CUDA device is available here; use 'auto' or 'cpu'")
    return torch.device(name)


def write_partition_report(store: RunStore, task: Task) -> None:
    labels, parts = task.info.get("labels"), task.info.get("parts")
    if labels is None or parts is None:
        return
    from fedveil.data.partition import partition_report

    report = partition_report(parts, labels, task.num_classes)
    (store.path / "partition.json").write_text(json.dumps(report, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class TaskFactory:
    """Picklable: rebuilds a config's task (in spawned workers and Flower's Ray workers)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> Task:
        return make_task(self.cfg)


def resolve_workers(cfg: RunConfig, device: torch.device) -> int:
    from fedveil.simulations.inprocess import auto_workers

    return cfg.simulation.workers or auto_workers(device)


class _QuietSimulatedDrops(logging.Filter):
    """Per-client warnings for simulated dropouts would flood the log; the round's count stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(
            isinstance(a, str) and a.startswith((DROPPED, LATE, "gone since"))
            for a in record.args or ()
        )


def simulate(
    cfg: RunConfig,
    *,
    on_round: Callable[[RoundRecord], None] | None = None,
    on_clients: Callable[[int, int], None] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run `cfg` on its transport; write the run directory; return the summary.

    `on_round(record)` follows rounds, `on_clients(done, total)` the clients within one
    (in-process engine only).
    """
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    task = make_task(cfg)  # loads the data: missing files fail here, before training
    store = RunStore(cfg.out)
    if not resume:
        store.clear()
        for name in PLOTS:
            (store.path / name).unlink(missing_ok=True)
    store.write_config(to_toml(cfg))
    write_partition_report(store, task)

    # Malicious-server secure aggregation needs client identity keys and a roster. The
    # simulated population's come from one fresh secret (never written anywhere); a
    # deployment's are made on each device and listed by the operator.
    identities = (
        DerivedIdentities() if cfg.secagg.enabled and cfg.secagg.threat == "malicious" else None
    )
    roster = None if identities is None else identities.roster
    run = RunLifecycle(cfg, task, store, device=device, roster=roster)
    availability = AvailabilityModel.from_config(cfg)

    def build_engine(transport: Any) -> RoundEngine:
        if availability is not None:
            transport = AvailabilityTransport(transport, availability)
        return run.engine(transport, on_round=on_round, resume=resume)

    quiet = _QuietSimulatedDrops()
    server_log = logging.getLogger("fedveil.server")
    if availability is not None:
        server_log.addFilter(quiet)
    try:
        if cfg.transport == "inprocess":
            from fedveil.simulations.inprocess import InProcessTransport

            workers = resolve_workers(cfg, device)
            with InProcessTransport(
                task,
                device,
                workers=workers,
                unit_size=cfg.simulation.vmap_clients,
                task_factory=TaskFactory(cfg),
                on_progress=on_clients,
                identities=identities,
                run_config=cfg,  # the clients' own copy: distributed-DP parameters
            ) as transport:
                engine = build_engine(transport)
                engine.run()
        else:
            from fedveil.simulations.flower_runner import run_on_flower

            workers = None
            engine = run_on_flower(cfg, task.num_clients, build_engine, identities=identities)[
                "engine"
            ]
    finally:
        server_log.removeFilter(quiet)
    wall = time.perf_counter() - start
    summary = engine.summary(wall)
    summary["device"] = str(device)
    summary["out"] = str(Path(cfg.out))
    if workers is not None:
        summary["workers"] = workers
    if cfg.simulation.plots:  # from metrics.jsonl, complete once the rounds are done
        summary["plots"] = _plots(store.path)
    return run.finish(engine, summary, model_metadata={"task": task.name})


def _plots(run_dir: Path) -> list[str]:
    try:
        from fedveil.simulations.plots import save_plots
    except ImportError:  # matplotlib is in the simulation extra, not the lean core
        log.warning("matplotlib is not installed: no plots (pip install 'fedveil[simulation]')")
        return []
    return [p.name for p in save_plots(run_dir)]
