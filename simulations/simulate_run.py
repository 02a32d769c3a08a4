"""`fedveil simulate`: one run, start to finish, into a run directory."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fedveil.config import ConfigError, RunConfig, load_config
from fedveil.config.resume import CONFIG_FILE, check_resume
from fedveil.privacy.secagg.identity_keys import DerivedIdentities
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.rounds import RoundEngine, RoundRecord
from fedveil.server.engine.runstore import RunStore
from fedveil.server.registry.lineage import write_lineage
from fedveil.simulations.availability import DROPPED, LATE, AvailabilityModel, AvailabilityTransport
from fedveil.simulations.failures import FailureLog, check_some_client_contributed
from fedveil.simulations.poisoning import BackdoorMeter, attack_plan, install_attack
from fedveil.simulations.run_setup import (
    TaskFactory,
    open_run_dir,
    prepare_task,
    resolve_device,
    resolve_workers,
    run_plots,
)
from fedveil.tasks import Task

log = logging.getLogger("fedveil.simulate")

CHECKPOINT = Path("checkpoint") / "state.pt"  # RunStore.checkpoint_path, before the store exists


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
    given: Mapping[str, str] | None = None,
    init_model: Path | None = None,
    init_ref: str | None = None,
) -> dict[str, Any]:
    """Run `cfg` on its transport; write the run directory; return the summary.

    `init_model`: a model file to start from instead of the seed's initialisation (its
    registry reference `init_ref`, if any), recorded in lineage.json; a resume continues
    from the checkpoint instead.

    `on_round(record)` follows rounds, `on_clients(done, total)` the clients within one
    (in-process engine only). `given`: the settings the user named on the command line
    (key -> how, e.g. 'data.num_clients' -> '--clients 50'); a custom task that does not
    honour one is refused. Raises RunFailed (after writing the run directory) when no
    client's update was ever aggregated. On KeyboardInterrupt (Ctrl-C; SIGTERM from the
    CLI) the last completed round's model and a summary marked interrupted are written.
    """
    if cfg.server.aggregation == "gossip":  # no coordinator: simulations/gossip/
        return _simulate_gossip(cfg, on_round, on_clients, resume, given, init_model)
    if cfg.server.aggregation == "allreduce":  # no coordinator, no round engine
        if resume or init_model is not None:
            raise ConfigError(
                'server.aggregation = "allreduce": --resume and --init-model are not offered'
            )
        from .allreduce_run import simulate_allreduce

        return simulate_allreduce(cfg)
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    recorded = None
    if resume:
        require_checkpoint(Path(cfg.out))
        recorded = recorded_config(Path(cfg.out))
    store = RunStore(cfg.out)
    prepared = prepare_task(cfg, device, given or {})
    cfg, task = prepared.cfg, prepared.task
    if recorded is not None:
        check_resume(recorded, cfg)
    open_run_dir(store, prepared, recorded)
    attempt = Attempt(cfg, task, device, store, resume=resume, on_round=on_round)
    if not resume:
        write_lineage(store.path, init_model, init_ref)
        if init_model is not None:
            attempt.run.start_from(init_model)
    try:
        with _quiet_simulated_drops(attempt.availability is not None):
            attempt.drive(on_clients)
    except KeyboardInterrupt:
        attempt.write_interrupted(time.perf_counter() - start)
        raise
    return attempt.finish(time.perf_counter() - start)


def _simulate_gossip(
    cfg: RunConfig,
    on_round: Callable[[Any], None] | None,
    on_clients: Callable[[int, int], None] | None,
    resume: bool,
    given: Mapping[str, str] | None,
    init_model: Path | None,
) -> dict[str, Any]:
    if resume or init_model is not None:
        flag = "--resume" if resume else "--init-model"
        raise ValueError(
            f"{flag} with server.aggregation = 'gossip': a gossip run keeps no checkpoint "
            "and starts every client from the seed's initial model"
        )
    from fedveil.simulations.gossip.gossip_run import simulate_gossip

    return simulate_gossip(cfg, on_round=on_round, on_clients=on_clients, given=given)


def require_checkpoint(out: Path) -> None:
    """--resume continues a run; without its checkpoint it would silently start afresh."""
    path = out / CHECKPOINT
    if not path.exists():
        raise ValueError(
            f"--resume: no checkpoint at {path}; nothing to resume "
            "(check --out, or leave --resume out to start a new run)"
        )


def recorded_config(out: Path) -> RunConfig:
    """The config a run to resume was started with (its config.toml)."""
    path = out / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"--resume: no {CONFIG_FILE} in {out}; nothing to resume")
    return load_config(path)


@contextmanager
def _quiet_simulated_drops(on: bool) -> Iterator[None]:
    quiet = _QuietSimulatedDrops()
    server_log = logging.getLogger("fedveil.server")
    if on:
        server_log.addFilter(quiet)
    try:
        yield
    finally:
        server_log.removeFilter(quiet)


class Attempt:
    """One call of `simulate` from its lifecycle on: the engine it builds is kept, so an
    interrupted run still writes its model and summary."""

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        device: torch.device,
        store: RunStore,
        *,
        resume: bool,
        on_round: Callable[[RoundRecord], None] | None,
    ) -> None:
        self.cfg, self.task, self.device, self.store = cfg, task, device, store
        self.resume, self.on_round = resume, on_round
        # Malicious-server secure aggregation needs client identity keys and a roster.
        # The simulated population's come from one fresh secret (never written
        # anywhere); a deployment's are made on each device and listed by the operator.
        malicious = cfg.secagg.enabled and cfg.secagg.threat == "malicious"
        self.identities = DerivedIdentities() if malicious else None
        roster = None if self.identities is None else self.identities.roster
        self.run = RunLifecycle(cfg, task, store, device=device, roster=roster)
        self.availability = AvailabilityModel.from_config(cfg)
        self.poisoning = attack_plan(cfg, task)  # [poisoning]; None: no attack
        self.backdoor: BackdoorMeter | None = None
        self.engine: RoundEngine | None = None
        self.failures: FailureLog | None = None
        self.workers: int | None = None

    def build_engine(self, transport: Any) -> RoundEngine:
        self.failures = FailureLog(transport)  # innermost: the clients' own failures
        outer: Any = self.failures
        if self.cfg.server.mode != "sync":  # async: the engine's clock follows availability
            self.engine = self.run.engine(
                outer, on_round=self.on_round, resume=self.resume, availability=self.availability
            )
        else:
            if self.availability is not None:
                outer = AvailabilityTransport(outer, self.availability)
            self.engine = self.run.engine(outer, on_round=self.on_round, resume=self.resume)
        if self.poisoning is not None:  # poisoning.json, and backdoor accuracy per round
            self.backdoor = install_attack(self.poisoning, self.task, self.engine, self.cfg)
        return self.engine

    def drive(self, on_clients: Callable[[int, int], None] | None) -> None:
        cfg = self.cfg
        if cfg.transport != "inprocess":
            from fedveil.simulations.flower_runner import run_on_flower

            run_on_flower(cfg, self.task.num_clients, self.build_engine, identities=self.identities)
            return
        from fedveil.simulations.inprocess import InProcessTransport

        self.workers = resolve_workers(cfg, self.device)
        with InProcessTransport(
            self.task,
            self.device,
            workers=self.workers,
            unit_size=cfg.simulation.vmap_clients,
            task_factory=TaskFactory(cfg),
            on_progress=on_clients,
            identities=self.identities,
            run_config=cfg,  # the clients' own copy: distributed-DP parameters
        ) as transport:
            self.build_engine(transport).run()

    def summary(self, wall: float) -> dict[str, Any]:
        assert self.engine is not None
        summary = self.engine.summary(wall)
        summary["device"] = str(self.device)
        summary["out"] = str(Path(self.cfg.out))
        if self.workers is not None:
            summary["workers"] = self.workers
        if self.backdoor is not None:
            summary["backdoor_accuracy"] = self.backdoor.last
        return summary

    def finish(self, wall: float) -> dict[str, Any]:
        """The closing files; then RunFailed if no client ever contributed."""
        engine, summary = self.engine, self.summary(wall)
        assert engine is not None and self.failures is not None
        if self.cfg.simulation.plots:  # from metrics.jsonl, complete once the rounds are done
            summary["plots"] = run_plots(self.store.path)
        summary = self.run.finish(engine, summary, model_metadata={"task": self.task.name})
        check_some_client_contributed(engine.history, self.failures)
        return summary

    def write_interrupted(self, wall: float) -> None:
        """The last kept round's model and a summary marked interrupted (the DP ledger was
        already closed as interrupted by the engine). The round in flight (its model
        stepped, its evaluation perhaps under way) is not counted: the summary, the model,
        metrics.jsonl and the checkpoint a resume starts from all end at the kept round."""
        if self.engine is None:
            return
        summary = self.summary(wall)
        summary.update(status="interrupted", interrupted=True)
        try:
            kept = self.run.finish_interrupted(
                self.engine, summary, model_metadata={"task": self.task.name}
            )
        except Exception as exc:  # the interruption is what the caller must hear about
            log.warning("interrupted: could not write the model and summary: %s", exc)
            return
        if not kept:
            log.warning("interrupted before a round completed in this session")
        else:
            log.warning("interrupted after round %d: model and summary written", kept)
