"""One silo as its own process (`fedveil silo`): the run's config, this silo's identity,
the rendezvous store; then the same training and secure mean as in simulation.

All silos must run the same config: each publishes the SHA-256 of its config's TOML in the
store, and a silo refuses to start (naming the rank) if any differs. Rank 0 draws the run
id (OS CSPRNG) and publishes it; it labels and binds every attempt's keys. The silo id is
the rank; the roster maps ranks to identity public keys.

Output in `out`: metrics.jsonl (one line per applied round), summary.json (the final
model's SHA-256, so operators can compare silos, and its test accuracy), model.safetensors,
and under distributed DP the silo's signed ledger.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.torch import save_file

from fedveil.config import RunConfig
from fedveil.config.run import to_toml
from fedveil.model_evaluation import evaluate
from fedveil.tasks import make_task

from .allreduce import SecureAllReduce, SiloSettings
from .rendezvous import Rendezvous, connect
from .round import RoundResult, SiloRound
from .silo_ledger import SiloLedger
from .silo_plan import plan_silos
from .silo_training import initial_model, train_silo


class SiloConfigMismatch(ValueError):
    """Another silo runs a different config."""


@dataclass(frozen=True)
class SiloProcess:
    cfg: RunConfig
    rendezvous: Rendezvous
    identity: Ed25519PrivateKey
    roster: Mapping[int, bytes]
    out: Path
    backend: str = "gloo"
    collective: str = "all_reduce"
    timeout_s: float = 60.0


def _agree_on_config(store: dist.Store, rdv: Rendezvous, text: str, timeout_s: float) -> None:
    mine = hashlib.sha256(text.encode()).hexdigest()
    store.set(f"config/{rdv.rank}", mine)
    names = [f"config/{r}" for r in range(rdv.world)]
    store.wait(names, timedelta(seconds=timeout_s))
    for rank, name in enumerate(names):
        theirs = store.get(name).decode()
        if theirs != mine:
            raise SiloConfigMismatch(
                f"silo {rank} runs a config with SHA-256 {theirs[:16]}, this silo "
                f"{mine[:16]}: every silo needs the same --config and --set"
            )


def _run_id(store: dist.Store, rdv: Rendezvous, timeout_s: float) -> str:
    if rdv.rank == 0:
        store.set("run_id", secrets.token_hex(16))
    store.wait(["run_id"], timedelta(seconds=timeout_s))
    return store.get("run_id").decode()


def run_silo(p: SiloProcess) -> dict[str, Any]:
    cfg, rdv = p.cfg, p.rendezvous
    if cfg.data.num_clients != rdv.world:
        raise ValueError(
            f"data.num_clients = {cfg.data.num_clients}: must equal --world {rdv.world} "
            "(each silo trains on its own client's data)"
        )
    if p.backend == "nccl":  # this silo's GPU
        local = os.environ.get("LOCAL_RANK")
        torch.cuda.set_device(int(local) if local else rdv.rank % torch.cuda.device_count())
    torch.manual_seed(cfg.seed)
    task = make_task(cfg)
    store = connect(rdv, p.timeout_s)
    _agree_on_config(store, rdv, to_toml(cfg), p.timeout_s)
    run_id = _run_id(store, rdv, p.timeout_s)
    model = initial_model(cfg, task)
    sizes = task.client_sizes
    largest = int(max(sizes)) if sizes is not None else len(task.client_data(rdv.rank))
    plan = plan_silos(cfg, model.flat.numel(), largest)
    settings = SiloSettings(
        run_id=run_id,
        silo=rdv.rank,
        world=rdv.world,
        identity=p.identity,
        roster=p.roster,
        timeout_s=p.timeout_s,
        backend=p.backend,
        collective=p.collective,
        min_silos=plan.min_silos,
    )
    p.out.mkdir(parents=True, exist_ok=True)
    metrics_path = p.out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    ledger = (
        SiloLedger(p.out / "ledger.jsonl", run_id, rdv.rank, p.identity)
        if plan.dp is not None
        else None
    )
    rounds = SiloRound(
        SecureAllReduce(store, settings), quantizer=plan.quantizer, dp=plan.dp, ledger=ledger
    )

    def record(round_num: int, result: RoundResult, vector: torch.Tensor) -> None:
        line = {
            "round": round_num,
            "members": list(result.members),
            "attempt": result.attempt,
            "aborted": result.aborted,
            "epsilon": result.epsilon,
        }
        with metrics_path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    vector = train_silo(cfg, task, rdv.rank, rounds, record)
    if ledger is not None:
        ledger.close(cfg.server.rounds)
    model.set(vector)
    save_file(
        {k: v.contiguous() for k, v in model.module.state_dict().items()},
        str(p.out / "model.safetensors"),
    )
    summary: dict[str, Any] = {
        "silo": rdv.rank,
        "run_id": run_id,
        "rounds": cfg.server.rounds,
        "model_sha256": hashlib.sha256(vector.numpy().tobytes()).hexdigest(),
        "trust_model": plan.describe(),
    }
    if task.test_data is not None:
        summary["test_accuracy"] = evaluate(model, vector, *task.test_data, task.loss_fn)[1]
    (p.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary
