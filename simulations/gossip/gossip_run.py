"""`fedveil simulate --aggregation gossip`: one gossip run into a run directory.

The directory is a coordinator run's: config.toml, partition.json, metrics.jsonl
(one GossipRecord per round), model.safetensors (the consensus model, with the
metadata that rebuilds it), summary.json, the plots, plus privacy/gossip.json
(simulations/gossip/gossip_privacy.py), and with DP-SGD the signed ledger (opened
before round 1, closed after the last; `fedveil privacy verify` checks it). There is
no checkpoint: a gossip run is not
resumable (the config of --resume names it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedveil.config import RunConfig
from fedveil.server.engine.ledger_opening import DpSgdLedger
from fedveil.server.engine.lifecycle import MODEL_FILE, model_metadata
from fedveil.server.engine.model_file import file_sha256, model_file_bytes
from fedveil.server.engine.runstore import RunStore, atomic_write_bytes
from fedveil.simulations.failures import RunFailed
from fedveil.simulations.gossip.engine import GossipEngine, GossipRecord
from fedveil.simulations.gossip.gossip_privacy import gossip_privacy_report
from fedveil.simulations.gossip.topology import spectral_gap

log = logging.getLogger("fedveil.gossip")


def simulate_gossip(
    cfg: RunConfig,
    *,
    on_round: Callable[[GossipRecord], None] | None = None,
    on_clients: Callable[[int, int], None] | None = None,
    given: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run the gossip rounds of `cfg` in the in-process engine; return the summary.
    Raises RunFailed (after writing the run directory) when no client ever trained."""
    from fedveil.simulations.inprocess import InProcessTransport
    from fedveil.simulations.run_setup import (
        PreparedTask,
        TaskFactory,
        open_run_dir,
        prepare_task,
        resolve_device,
        resolve_workers,
    )

    start = time.perf_counter()
    device = resolve_device(cfg.device)
    store = RunStore(cfg.out)
    prepared: PreparedTask = prepare_task(cfg, device, given or {})
    cfg, task = prepared.cfg, prepared.task
    open_run_dir(store, prepared, None)
    (store.path / "privacy" / "gossip.json").unlink(missing_ok=True)
    workers = resolve_workers(cfg, device)

    def record(r: GossipRecord) -> None:
        store.append_metrics(r.to_dict())
        if on_round is not None:
            on_round(r)

    ledger = dp_sgd_ledger(cfg, store)
    with InProcessTransport(
        task,
        device,
        workers=workers,
        unit_size=cfg.simulation.vmap_clients,
        task_factory=TaskFactory(cfg),
        on_progress=on_clients,
        run_config=cfg,
    ) as transport:
        engine = GossipEngine(cfg, task, transport, device, on_round=record)
        try:
            engine.run()
        except BaseException as exc:
            if ledger is not None:
                ledger.close("interrupted", engine.round, f"{type(exc).__name__}: {exc}"[:500])
            raise
    consensus = engine.consensus()
    model = save_consensus(store, engine, cfg, consensus)
    if ledger is not None:  # the closing record binds the model file just written
        ledger.close("final", engine.round, model_sha256=file_sha256(model))
    sizes = _sizes(task.client_sizes, task)
    report = gossip_privacy_report(
        cfg, sizes, engine.round, [len(nb) for nb in engine.mixing.graph]
    )
    (store.path / "privacy").mkdir(exist_ok=True)
    atomic_write_bytes(
        store.path / "privacy" / "gossip.json", (json.dumps(report, indent=2) + "\n").encode()
    )
    last = engine.history[-1] if engine.history else None
    summary: dict[str, Any] = {
        "aggregation": "gossip",
        "topology": cfg.gossip.topology,
        "degree_max": max(len(nb) for nb in engine.mixing.graph),
        "spectral_gap": spectral_gap(engine.mixing),
        "rounds": engine.round,
        "client_updates": engine.client_updates,
        "test_accuracy": None if last is None else last.test_accuracy,
        "test_loss": None if last is None else last.test_loss,
        "consensus_distance": None if last is None else last.consensus_distance,
        "bytes_sent_per_node": sum(r.bytes_sent_per_node_mean for r in engine.history),
        "privacy": "privacy/gossip.json",
        "device": str(device),
        "workers": workers,
        "out": str(Path(cfg.out)),
        "wall_s": time.perf_counter() - start,
    }
    if cfg.simulation.plots:
        from fedveil.simulations.run_setup import run_plots

        summary["plots"] = run_plots(store.path)
    store.write_summary(summary)
    if engine.client_updates == 0:
        raise RunFailed(
            "no client's training succeeded in any round; first causes: "
            + "; ".join(engine.failures or ["none recorded"])
        )
    return summary


def dp_sgd_ledger(cfg: RunConfig, store: RunStore) -> DpSgdLedger | None:
    """With DP-SGD, the run's signed ledger, as a coordinator run's DP-SGD-only ledger
    (server/engine/ledger_opening.py): the opening states the plan, the closing record
    the rounds run; it accounts no release (each client's DP-SGD is accounted in
    privacy/gossip.json). `fedveil privacy verify` checks it. None without DP-SGD."""
    if not cfg.client.dp_sgd_noise > 0:
        return None
    from fedveil.privacy.dp.signing import load_or_create_signer

    store.ledger_path.unlink(missing_ok=True)  # a gossip run is never resumed
    return DpSgdLedger(
        cfg,
        store.ledger_path,
        run_id=store.run_identity()["run_id"],
        signer=load_or_create_signer(),
    )


def save_consensus(
    store: RunStore, engine: GossipEngine, cfg: RunConfig, consensus: torch.Tensor
) -> Path:
    """The consensus model as safetensors, with what rebuilds it."""
    meta = {
        **model_metadata(cfg, engine.task, engine.round),
        "aggregation": "gossip",
        "consensus": "average of the clients' models",
    }
    path = store.path / MODEL_FILE
    atomic_write_bytes(path, model_file_bytes(engine.model.named_tensors(consensus), meta))
    return path


def _sizes(known: Any, task: Any) -> list[int]:
    if known is not None:
        return [int(s) for s in known]
    return [len(task.client_data(cid)) for cid in range(task.num_clients)]
