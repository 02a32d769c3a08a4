"""The deployed ServerApp: fedveil's round engine over the SuperLink's Grid.

`flwr-serverapp` loads `app` from here for every Flower run the service
starts. Its only run config is the fedveil run id; everything else comes from
the run directory under FEDVEIL_STATE_DIR (inherited from `fedveil server`):
the resolved config, the deploy settings and, after a crash, the checkpoint.

Resume: a run directory holds the last completed round atomically (RunStore).
A new Flower run for the same fedveil run restores it, drops metric lines of
rounds that were never checkpointed, and goes on from the next round — the
sampler RNG, server optimizer and weights are exactly those of the completed
round, so no round is applied twice and the result equals an uninterrupted run.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedveil.config import DeploySettings, RunConfig, load_config
from fedveil.privacy.secagg import flower_run_id as flower_run_id_bytes
from fedveil.privacy.secagg.identity_files import load_roster
from fedveil.privacy.secagg.identity_keys import Roster
from fedveil.protocol.deployment import RUN_ID_KEY
from fedveil.server.coordinator.clients import ClientRegistry
from fedveil.server.coordinator.deploy_transport import DeployTransport
from fedveil.server.coordinator.drift_run import (
    EVALUATE,
    drift_spec,
    evaluate_on_devices,
    evaluate_on_devices_dp,
)
from fedveil.server.coordinator.rundir import ROSTER_FILE, RunDir, write_json
from fedveil.server.coordinator.superlink import STATE_ENV
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.round_record import public_summary
from fedveil.server.engine.rounds import RoundRecord
from fedveil.server.engine.runstore import RunStore
from fedveil.tasks import make_server_task

log = logging.getLogger("fedveil.serverapp")

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_id = str(context.run_config.get(RUN_ID_KEY, ""))
    state_dir = os.environ.get(STATE_ENV)
    if not state_dir:
        raise RuntimeError(f"{STATE_ENV} is not set: start runs through `fedveil server`")
    run_deployed(grid, Path(state_dir), run_id, flower_run_id=context.run_id)


def _log_to(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("fedveil")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def run_deployed(grid: Grid, state_dir: Path, run_id: str, *, flower_run_id: int) -> dict[str, Any]:
    rd = RunDir(state_dir, run_id)
    if not rd.exists():
        raise RuntimeError(f"run {run_id!r}: no run directory under {state_dir}")
    handler = _log_to(rd / "server.log")
    try:
        with rd.lock(timeout=120.0):
            rd.write_status(phase="starting", flower_run_id=flower_run_id, error=None)
            try:
                return _run(grid, state_dir, rd, flower_run_id)
            except Exception as exc:
                log.exception("run %s failed", run_id)
                rd.write_status(phase="failed", error=f"{type(exc).__name__}: {exc}")
                raise
    finally:
        logging.getLogger("fedveil").removeHandler(handler)
        handler.close()


def _malicious_roster(cfg: RunConfig, rd: RunDir) -> Roster | None:
    """The run's roster when secure aggregation defends against a malicious server."""
    if not (cfg.secagg.enabled and cfg.secagg.threat == "malicious"):
        return None
    roster = load_roster(rd / ROSTER_FILE, "the run's roster")
    log.info(
        "secure aggregation in malicious-server mode: roster of %d clients, fingerprint %s",
        len(roster),
        roster.fingerprint(),
    )
    return roster


def _log_round(record: RoundRecord, private: bool) -> None:
    if not private:
        log.info(
            "round %d: %d/%d aggregated, %d dropped, %.2f s",
            record.round,
            record.cohort_aggregated,
            record.cohort_planned,
            record.dropped,
            record.duration_s,
        )
    else:  # counts and durations reveal participation: the private annex has them
        log.info("round %d: %s", record.round, record.extra.get("status"))


def _wait_for_clients(
    transport: DeployTransport, rd: RunDir, cfg: RunConfig, deploy: DeploySettings, done: int
) -> int:
    """Block until enough clients are connected (deploy.wait_for_clients), or fail the run."""
    want = deploy.wait_for_clients or cfg.server.min_clients
    rd.write_status(phase="waiting_for_clients", round=done, rounds=cfg.server.rounds)
    have = transport.wait_for(want, deploy.wait_timeout_s)
    if have < want:
        raise RuntimeError(
            f"only {have} of the {want} clients needed (deploy.wait_for_clients) connected "
            f"within {deploy.wait_timeout_s:.0f} s"
        )
    return have


def _complete_summary(
    summary: dict[str, Any],
    records: list[dict[str, Any]],
    rd: RunDir,
    flower_run_id: int,
    wall_s: float,
    private: bool,
) -> None:
    """The engine's summary as the deployed run reports it (counts only without DP)."""
    summary.update(
        transport="deployment",
        flower_run_id=flower_run_id,
        out=str(rd.path),
        attempt_wall_s=wall_s,
    )
    if not private:
        summary.update(
            rounds_applied=sum(bool(r.get("applied")) for r in records),
            dropped_total=sum(int(r.get("dropped") or 0) for r in records),
        )
    summary.pop("wall_s", None)


def _run(grid: Grid, state_dir: Path, rd: RunDir, flower_run_id: int) -> dict[str, Any]:
    start = time.perf_counter()
    cfg = load_config(rd / "config.toml")
    deploy = rd.deploy()
    task = make_server_task(cfg)  # the test set and model; devices hold the training data
    store = RunStore(rd.path)
    registry = ClientRegistry(state_dir)
    enrolled = registry.node_map() if registry.path.exists() else None

    # The same privacy pipeline as `fedveil simulate` (secure aggregation channel, central
    # or distributed DP); its accountant is rebuilt from the run's ledger on every attempt.
    roster = _malicious_roster(cfg, rd)
    run = RunLifecycle(
        cfg,
        task,
        store,
        roster=roster,
        secagg_run_id=flower_run_id_bytes(flower_run_id),
        # The ledger is signed with the coordinator user's key (the per-user key store),
        # where `fedveil privacy verify` on this machine finds it.
        ledger_run_id=rd.run_id,
    )
    drift = drift_spec(rd)  # a drift run starts from a registered model version
    if drift is not None:
        run.start_from(Path(drift["init"]))
        log.info("run %s: %s of model version %s", rd.run_id, drift["kind"], drift["version"])
    private = run.privacy is not None
    transport = DeployTransport(
        grid,
        num_clients=task.num_clients,
        model_size=run.model_size,  # a device whose model differs is refused at hello
        enrolled=enrolled,
        setup={
            "run_num_classes": int(task.num_classes),
            "run_input_shape": [int(d) for d in task.input_shape],
        },
    )

    if drift is not None and drift["kind"] == EVALUATE:
        evaluation = _Evaluation(rd, cfg, deploy, drift, flower_run_id, roster)
        return _evaluate_version(run, transport, evaluation, start)

    def on_round(record: RoundRecord) -> None:
        # After the engine's checkpoint: the published model is always a checkpointed one.
        run.save_model(engine, {"task": task.name, "round": str(record.round)})
        rd.write_status(
            phase="training",
            round=record.round,
            rounds=cfg.server.rounds,
            connected=len(transport.connected()),
        )
        _log_round(record, private)

    # restored from the checkpoint, if any; server.mode = async | ssp: devices' replies
    # arrive in wall-clock order (never the simulated clock), C in flight at all times
    engine = run.engine(transport, on_round=on_round, wall_clock=True)
    engine.annotators.append(lambda r: r.extra.update(clients_connected=len(transport.connected())))
    have = _wait_for_clients(transport, rd, cfg, deploy, engine.round)
    log.info("%d clients connected; training from round %d", have, engine.round + 1)
    rd.write_status(phase="training", round=engine.round, rounds=cfg.server.rounds, connected=have)
    summary = engine.run()  # with DP: stops before a round the budget cannot pay for
    records = store.read_metrics()  # the whole run, not only this attempt
    _complete_summary(summary, records, rd, flower_run_id, time.perf_counter() - start, private)
    run.finish(engine, summary, model_metadata={"task": task.name, "round": str(engine.round)})
    rd.write_status(phase="completed", round=engine.round, rounds=cfg.server.rounds)
    log.info("run %s completed: %s", rd.run_id, summary)
    return summary


@dataclass(frozen=True)
class _Evaluation:
    """A drift evaluation's run: its directory, config, deploy settings and drift.json."""

    rd: RunDir
    cfg: RunConfig
    deploy: DeploySettings
    drift: dict[str, Any]
    flower_run_id: int
    roster: Roster | None


def _evaluate_version(
    run: RunLifecycle, transport: DeployTransport, ev: _Evaluation, start: float
) -> dict[str, Any]:
    """A drift evaluation: the version on the devices' held-out data, no training; for a
    DP version an accounted release under secure aggregation (drift.json's "dp")."""
    rd, cfg, drift = ev.rd, ev.cfg, ev.drift
    if run.privacy is not None:  # drift.py puts a DP version's DP in drift.json, not [dp]
        raise RuntimeError("a drift evaluation trains nothing: its config has no [dp]")
    have = _wait_for_clients(transport, rd, cfg, ev.deploy, 0)
    rd.write_status(phase="evaluating", round=0, rounds=0, connected=have)
    weights = run.engine(transport, resume=False).weights
    if drift.get("dp") is not None:
        summary = evaluate_on_devices_dp(
            cfg,
            transport,
            transport.connected(),
            weights,
            drift,
            rd,
            roster=ev.roster,
            secagg_run_id=flower_run_id_bytes(ev.flower_run_id),
        )
    else:
        summary = evaluate_on_devices(cfg, transport, transport.connected(), weights)
    summary.update(
        kind="drift-evaluation",
        model_version=drift["version"],
        transport="deployment",
        flower_run_id=ev.flower_run_id,
        attempt_wall_s=time.perf_counter() - start,
    )
    # A DP evaluation's duration depends on who answered: not published (public_time.py).
    summary = public_summary(summary, dp=drift.get("dp") is not None)
    write_json(rd / "summary.json", summary)
    rd.write_status(phase="completed", round=0, rounds=0)
    # Under DP the summary is the public release alone (no counts): safe to log.
    log.info("run %s: drift evaluation of %s: %s", rd.run_id, drift["version"], summary)
    return summary
