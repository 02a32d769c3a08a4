"""`fedveil simulate --aggregation allreduce`: N silos in this process, no coordinator.

Every client of the population is a silo (one thread each: client/silo/local.py) that
trains on its own data and takes the secure mean with the others through gloo on a
loopback store, exactly as `fedveil silo` processes do. Silo 0 evaluates the model after
each round (every silo holds the same one: checked at the end) and writes the run
directory: config.toml, metrics.jsonl, model.safetensors, summary.json, and under
distributed DP each silo's signed ledger in silos/<id>/ledger.jsonl and the silos'
identity public keys in silos/roster.json (the keys `fedveil privacy verify` checks the
ledgers against, unless given others with --silo-keys).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from fedveil.client.silo import SecureAllReduce, SiloRound
from fedveil.client.silo.local import run_silos
from fedveil.client.silo.round import RoundResult
from fedveil.client.silo.silo_ledger import SiloLedger
from fedveil.client.silo.silo_plan import SiloPlan, plan_silos
from fedveil.client.silo.silo_training import initial_model, train_silo
from fedveil.config import RunConfig
from fedveil.config.run import to_toml
from fedveil.model_evaluation import evaluate
from fedveil.privacy.secagg.identity_keys import DerivedIdentities, Roster
from fedveil.server.engine.privacy_report import silo_ledger_path, silo_roster_path
from fedveil.server.engine.runstore import RunStore
from fedveil.tasks import Task, make_task

SILO_TIMEOUT_S = 60.0


def _max_weight(task: Task) -> int:
    if task.client_sizes is not None:
        return int(max(task.client_sizes))
    return max(len(task.client_data(i)) for i in range(task.num_clients))


def simulate_allreduce(cfg: RunConfig) -> dict[str, Any]:
    start = time.perf_counter()
    task = make_task(cfg)
    store = RunStore(cfg.out)
    store.clear()
    for old in Path(cfg.out).glob("silos/*/ledger.jsonl"):  # a previous run's
        old.unlink()
    silo_roster_path(Path(cfg.out)).unlink(missing_ok=True)
    store.write_config(to_toml(cfg))
    model = initial_model(cfg, task)
    initial = model.flat.detach().clone()  # made once: the silo threads share torch's RNG
    plan = plan_silos(cfg, model.flat.numel(), _max_weight(task))
    run_id = secrets.token_hex(16)
    out = Path(cfg.out)
    identities = DerivedIdentities()  # from an OS-random secret
    if plan.dp is not None:  # pin the keys the ledgers are signed with
        roster = Roster({s: identities.public_key(s) for s in range(plan.world)})
        silo_roster_path(out).parent.mkdir(parents=True, exist_ok=True)
        silo_roster_path(out).write_text(roster.to_json())

    def record(round_num: int, result: RoundResult, vector: torch.Tensor) -> None:
        metrics: dict[str, Any] = {
            "round": round_num,
            "silos": len(result.members),
            "attempt": result.attempt,
            "aborted_attempts": len(result.aborted),
        }
        if result.epsilon is not None:
            metrics["epsilon"] = result.epsilon
        if task.test_data is not None:
            loss, accuracy, _ = evaluate(model, vector, *task.test_data, task.loss_fn)
            metrics.update(test_loss=loss, test_accuracy=accuracy)
        store.append_metrics(metrics)

    def silo_body(allreduce: SecureAllReduce) -> torch.Tensor:
        silo = allreduce.settings.silo
        ledger = (
            SiloLedger(silo_ledger_path(out, silo), run_id, silo, allreduce.settings.identity)
            if plan.dp is not None
            else None
        )
        rounds = SiloRound(allreduce, quantizer=plan.quantizer, dp=plan.dp, ledger=ledger)
        vector = train_silo(cfg, task, silo, rounds, record if silo == 0 else None, initial)
        if ledger is not None:
            ledger.close(cfg.server.rounds)
        return vector

    torch.set_num_threads(1)  # N silos in threads: one core each, not N x all of them
    vectors = run_silos(
        plan.world,
        silo_body,
        run_id=run_id,
        timeout_s=SILO_TIMEOUT_S,
        identities=identities,
        min_silos=plan.min_silos,
    )
    if any(not torch.equal(v, vectors[0]) for v in vectors):
        raise RuntimeError("the silos' final models differ: their sums disagreed")
    model.set(vectors[0])
    save_file(
        {k: v.contiguous() for k, v in model.module.state_dict().items()},
        str(out / "model.safetensors"),
    )
    return _summary(cfg, plan, store, time.perf_counter() - start)


def _summary(cfg: RunConfig, plan: SiloPlan, store: RunStore, wall_s: float) -> dict[str, Any]:
    metrics = store.read_metrics()
    last = metrics[-1] if metrics else {}
    summary = {
        "aggregation": "allreduce",
        "rounds": len(metrics),
        "silos": plan.world,
        "min_silos": plan.min_silos,
        "test_accuracy": last.get("test_accuracy"),
        "epsilon": last.get("epsilon"),
        "trust_model": plan.describe(),
        "wall_s": wall_s,
    }
    store.write_summary(summary)
    return summary
