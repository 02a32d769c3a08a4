"""What every in-process run does before and after its rounds, whatever aggregates them
(the round engine in simulate_run.py, gossip in simulations/gossip/): resolve the device
and workers, load and check the task, open the run directory with its config record and
partition report, and draw the plots."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig, config_from_dict, to_toml, toml_text
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.plots import PLOTS
from fedveil.taskcheck import check_settings_read, check_task, reading_config
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
    """The worker processes a run starts: the config's (0: auto), never more than its
    clients, since a worker beyond the population would only start, idle and hold memory
    (1,024 requested for 4 clients used to start 1,024 processes)."""
    from fedveil.simulations.inprocess import auto_workers

    wanted = cfg.simulation.workers or auto_workers(device)
    if wanted > cfg.data.num_clients:
        if cfg.simulation.workers:
            log.info(
                "simulation.workers = %d: %d started, one per client (data.num_clients = %d)",
                wanted,
                cfg.data.num_clients,
                cfg.data.num_clients,
            )
        return cfg.data.num_clients
    return wanted


@dataclass
class PreparedTask:
    """The task a run trains, checked, and the config it runs under."""

    cfg: RunConfig
    task: Task
    # [data]/[model] keys a custom task read (None: the built-in task, which reads all).
    reads: set[str] | None = None


def prepare_task(cfg: RunConfig, device: torch.device, given: Mapping[str, str]) -> PreparedTask:
    """Load the task (the data: missing files fail here, before training). A custom task's
    contract is checked on one client first, and the settings it ignores are refused; its
    population becomes data.num_clients (DP's sampling rate is per_round / num_clients)."""
    ref = cfg.model.task
    if ref is None:
        return PreparedTask(cfg, make_task(cfg))
    reading, reads = reading_config(cfg)
    task = make_task(reading)
    check_task(task, ref, batch_size=cfg.client.batch_size, device=str(device))
    check_settings_read(ref, task, reads, given, cfg.data.num_clients)
    if task.num_clients != cfg.data.num_clients:
        log.info("task %s: %d clients (data.num_clients follows)", task.name, task.num_clients)
        values = cfg.to_dict()
        values["data"]["num_clients"] = task.num_clients
        cfg = config_from_dict(_without_none(values))
    return PreparedTask(cfg, task, reads)


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, dict) else v
        for k, v in values.items()
        if v is not None
    }


def config_record(prepared: PreparedTask) -> str:
    """config.toml: the run as it ran. A custom task's run records the task and the [data]
    and [model] settings it read, not the built-in defaults it ignored."""
    cfg, task = prepared.cfg, prepared.task
    if prepared.reads is None:
        return to_toml(cfg)
    values = cfg.to_dict()
    for section in ("data", "model"):
        values[section] = {
            k: v
            for k, v in values[section].items()
            if f"{section}.{k}" in prepared.reads or k in ("task", "num_clients")
        }
    header = (
        f"# task {task.name!r} from {cfg.model.task}: {task.num_clients} clients, input "
        f"shape {task.input_shape}, {task.num_classes} classes\n"
    )
    return header + toml_text(values)


def open_run_dir(store: RunStore, prepared: PreparedTask, recorded: RunConfig | None) -> None:
    """A new run clears the directory and records its config; a resumed run keeps its
    config.toml, rewritten only to record a changed number of rounds (the run as it ran)."""
    if recorded is None:
        store.clear()
        for name in PLOTS:
            (store.path / name).unlink(missing_ok=True)
    elif recorded.server.rounds == prepared.cfg.server.rounds:
        write_partition_report(store, prepared.task)
        return
    store.write_config(config_record(prepared))
    write_partition_report(store, prepared.task)


def run_plots(run_dir: Path) -> list[str]:
    """Draw the run directory's plots (none, with a warning, without matplotlib)."""
    try:
        from fedveil.simulations.plots import save_plots
    except ImportError:  # matplotlib is in the simulation extra, not the lean core
        log.warning("matplotlib is not installed: no plots (pip install 'fedveil[simulation]')")
        return []
    return [p.name for p in save_plots(run_dir)]
