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
from fedveil.server.pipeline import make_privacy_pipeline
from fedveil.server.privacy_report import write_privacy_report
from fedveil.server.rounds import RoundEngine, RoundRecord
from fedveil.server.runstore import RunStore
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
    from fedveil.simulations.partition import partition_report

    report = partition_report(parts, labels, task.num_classes)
    (store.path / "partition.json").write_text(json.dumps(report, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def simulate(
    cfg: RunConfig,
    *,
    on_round: Callable[[RoundRecord], None] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run `cfg` on its transport; write the run directory; return the summary."""
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    task = make_task(cfg)  # loads the data: missing files fail here, before training
    store = RunStore(cfg.out)
    if not resume:
        store.clear()
    store.write_config(to_toml(cfg))
    write_partition_report(store, task)

    privacy, channel = make_privacy_pipeline(cfg, task, store.ledger_path)

    def build_engine(transport: Any) -> RoundEngine:
        engine = RoundEngine(
            cfg,
            task,
            transport,
            store=store,
            device=device,
            on_round=on_round,
            privacy=privacy,
            channel=channel,
        )
        state = store.load_checkpoint() if resume else None
        if state is not None:
            engine.restore(state)
            store.truncate_metrics(engine.round)
            log.info("resuming %s after round %d", store.path, engine.round)
        return engine

    if cfg.transport == "inprocess":
        from .inprocess import InProcessTransport

        engine = build_engine(InProcessTransport(task, device))
        engine.run()
    else:
        from .flower_runner import run_on_flower

        engine = run_on_flower(cfg, task.num_clients, build_engine)["engine"]
    wall = time.perf_counter() - start
    summary = engine.summary(wall)
    summary["device"] = str(device)
    summary["out"] = str(Path(cfg.out))
    engine.model.save(engine.weights, str(store.path / "model.safetensors"), {"task": task.name})
    if privacy is not None:
        write_privacy_report(store.path, privacy.config)
    store.write_summary(summary)
    return summary
