"""One run's lifecycle around the round engine, shared by `fedveil simulate` and the
deployed ServerApp.

    task (the caller's) -> privacy pipeline + global model -> engine over a transport
    -> restore -> run -> save model -> privacy report -> summary

What differs stays with each caller and comes in as arguments: the task (a simulated
population or the coordinator's test set), the transport (built once the model's size is
known), `on_round` hooks, status writes and the summary's own keys. Resume semantics are
the same for both: the checkpoint is restored, then metric and private lines of rounds it
does not hold are dropped, so no round is applied or recorded twice.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedveil import __version__
from fedveil.config import ConfigError, RunConfig
from fedveil.flat_model import FlatModel
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.server.engine.aggregation import UpdateChannel
from fedveil.server.engine.ledger_opening import DpSgdLedger, is_dp_run
from fedveil.server.engine.model_file import MODEL_FILE, model_file_bytes, sha256_hex
from fedveil.server.engine.pipeline import make_privacy_pipeline, private_run_args
from fedveil.server.engine.privacy_report import write_privacy_report
from fedveil.server.engine.release_mechanism import ReleaseMechanism
from fedveil.server.engine.round_record import public_summary
from fedveil.server.engine.rounds import RoundEngine, RoundRecord, initial_model
from fedveil.server.engine.runstore import RunStore, atomic_write_bytes
from fedveil.server.engine.schedulers import make_scheduler
from fedveil.server.engine.sim_clock import Availability
from fedveil.server.engine.tracking import RunTracking, close_unfinished, summary_status
from fedveil.server.engine.transport import Transport
from fedveil.tasks import Task

log = logging.getLogger("fedveil.server")


class RunLifecycle:
    """The steps of one run (or one attempt of it, after a crash) into `store`.

    Built before any transport: the privacy pipeline (its accountant rebuilt from the
    run's ledger) and the global model, whose size `model_size` a transport may need.
    `roster`: the clients' identity keys (malicious-server secure aggregation);
    `secagg_run_id`: the run every secure-aggregation session names; `ledger_run_id`:
    the run id the DP ledger is bound to (None: the run directory's own identity).
    """

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        store: RunStore,
        *,
        device: torch.device | str = "cpu",
        roster: Mapping[int, bytes] | None = None,
        secagg_run_id: bytes = SIMULATION_RUN_ID,
        ledger_run_id: str | None = None,
    ) -> None:
        self.cfg, self.task, self.store = cfg, task, store
        self.ledger_run_id = ledger_run_id
        self.device = torch.device(device)
        self.privacy: ReleaseMechanism | None
        self.channel: UpdateChannel
        self.privacy, self.channel = make_privacy_pipeline(
            cfg,
            task,
            store.ledger_path,
            roster,
            secagg_run_id=secagg_run_id,
            **private_run_args(cfg, store, run_id=ledger_run_id),
        )
        # Built first so a transport can be told the model's size at construction; a
        # function of the seed alone, so the same model as the engine would build.
        self._model: FlatModel | None = FlatModel(initial_model(task, cfg.seed), self.device)
        self.model_size = self._model.size
        # The round the engine's checkpoint left off at (0: a fresh run), kept before
        # this session's rounds (finish_interrupted).
        self.restored_round = 0
        # [tracking]: publishes what metrics.jsonl publishes (public_json under DP).
        self.tracking = RunTracking.open(cfg, store.path, dp=cfg.publishes_privately)
        if self.tracking is not None:  # a crash never reaches finish(): marked failed
            weakref.finalize(self, close_unfinished, self.tracking)

    def start_from(self, path: Path) -> None:
        """Start from a trained model file (a retraining run, a drift evaluation) instead
        of the seed's initialisation; on a resume the checkpoint still wins. Before engine()."""
        if self._model is None:
            raise RuntimeError("start_from() must come before engine()")
        try:
            self._model.set(self._model.load(str(path)))
        except ValueError as exc:  # another task's model: name both and the way out
            trained = _file_task(path)
            raise ConfigError(
                f"init model {path}: {exc}: it holds a {trained or 'different'} model and "
                f"this run trains {self.task.name}; start from a model of the same task, or "
                "give this run the settings that trained it (--config RUN_DIR/config.toml)"
            ) from None

    def engine(
        self,
        transport: Transport,
        *,
        on_round: Callable[[RoundRecord], None] | None = None,
        resume: bool = True,
        availability: Availability | None = None,
        wall_clock: bool = False,
        publish_model: bool = True,
    ) -> RoundEngine:
        """The round engine over `transport`, restored from the checkpoint if `resume`
        and there is one, with the scheduler of server.mode (schedulers.make_scheduler):
        async | ssp arrivals follow `availability` (simulated latency and dropouts; None:
        every unit takes 1 s), or with `wall_clock` (a deployment's devices) come back
        when their exchanges end. `wall_clock` changes nothing under sync. `publish_model`:
        the ledger's closing record binds model.safetensors, written just before it
        (False: a run that publishes no model, e.g. a privacy audit's)."""
        model, self._model = self._model, None  # the first engine takes the model built
        if self.tracking is not None:
            on_round = _tracked(self.tracking, on_round)
        scheduler = make_scheduler(self.cfg, availability=availability, wall_clock=wall_clock)
        engine = RoundEngine(
            self.cfg,
            self.task,
            transport,
            store=self.store,
            channel=self.channel,
            device=self.device,
            on_round=on_round,
            privacy=self.privacy,
            model=model,
            scheduler=scheduler,
        )
        if self.privacy is None and is_dp_run(self.cfg):
            # DP-SGD only: no release to account, but a signed ledger devices witness.
            engine.witness_ledger(self._dp_sgd_ledger())
        if publish_model:  # the ledger's closing record binds the model file as of it
            engine.bind_model(lambda kind: self._publish_at_close(engine, kind))
        if resume:
            self.restore(engine)
        return engine

    def _dp_sgd_ledger(self) -> DpSgdLedger:
        from fedveil.privacy.dp.signing import load_or_create_signer

        return DpSgdLedger(
            self.cfg,
            self.store.ledger_path,
            run_id=self.ledger_run_id or self.store.run_identity()["run_id"],
            signer=load_or_create_signer(),
        )

    def restore(self, engine: RoundEngine) -> bool:
        """Restore the last checkpoint (if any) and drop the metric and private lines of
        rounds after it; whether there was one."""
        state = self.store.load_checkpoint()
        if state is None:
            return False
        engine.restore(state)
        self.restored_round = engine.round
        self.store.truncate_metrics(engine.round)
        self.store.truncate_private(engine.round)
        log.info(
            "resuming %s after round %d of %d",
            self.store.path,
            engine.round,
            self.cfg.server.rounds,
        )
        return True

    def finish_interrupted(
        self, engine: RoundEngine, summary: dict[str, Any], *, model_metadata: Mapping[str, str]
    ) -> int:
        """An interrupted run's closing files, as of its last kept round; returns it.

        A round is kept once its metrics line and the checkpoint are stored, and a resume
        starts after it. The round in flight may already have stepped the model (and be
        evaluating it): neither that model nor its number is published, so the summary,
        model.safetensors and a resume agree. With no round kept, no model is written.
        """
        kept = self._kept_round(engine)
        if kept == engine.round:
            self.finish(engine, {**summary, "rounds": kept}, model_metadata=model_metadata)
            return kept
        state = self.store.load_checkpoint()  # the kept round's model
        if state is not None and int(state["round"]) <= kept:
            self.write_model(engine.model, state["weights"], kept, model_metadata)
        self._close({**summary, "rounds": kept})
        return kept

    def _kept_round(self, engine: RoundEngine) -> int:
        """The last round whose metrics line and checkpoint are stored."""
        return engine.history[-1].round if engine.history else self.restored_round

    def _publish_at_close(self, engine: RoundEngine, kind: str) -> str | None:
        """The model file as of the ledger's closing record of `kind`, written now (the
        same bytes finish() or finish_interrupted() write after it); its SHA-256, or None
        when no model is published (interrupted before a round was kept)."""
        if kind == "final" or self._kept_round(engine) == engine.round:
            return sha256_hex(self.save_model(engine, {}).read_bytes())
        kept = self._kept_round(engine)
        state = self.store.load_checkpoint()
        if state is None or int(state["round"]) > kept:
            return None
        return sha256_hex(self.write_model(engine.model, state["weights"], kept, {}).read_bytes())

    def save_model(self, engine: RoundEngine, metadata: Mapping[str, str]) -> Path:
        """The global model as safetensors, written atomically (a reader never sees half)."""
        return self.write_model(engine.model, engine.weights, engine.round, metadata)

    def write_model(
        self, model: FlatModel, weights: torch.Tensor, round_num: int, metadata: Mapping[str, str]
    ) -> Path:
        """`weights` (round `round_num`'s) as model.safetensors, written atomically."""
        path = self.store.path / MODEL_FILE
        tensors = model.named_tensors(weights.detach().cpu())
        meta = {**model_metadata(self.cfg, self.task, round_num), **metadata}
        atomic_write_bytes(path, model_file_bytes(tensors, meta))
        return path

    def finish(
        self, engine: RoundEngine, summary: dict[str, Any], *, model_metadata: Mapping[str, str]
    ) -> dict[str, Any]:
        """The run's closing files: the model, the privacy report under DP, the summary."""
        self.save_model(engine, model_metadata)
        return self._close(summary)

    def _close(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The privacy report under DP, the summary, the tracking run's end."""
        if self.privacy is not None:
            write_privacy_report(self.store.path, self.privacy.config)
        self.store.write_summary(public_summary(summary, dp=self.privacy is not None))
        if self.tracking is not None:
            files = [self.store.path / n for n in (MODEL_FILE, "summary.json", "config.toml")]
            self.tracking.close(summary_status(summary), files)
        return summary


def _tracked(
    tracking: RunTracking, on_round: Callable[[RoundRecord], None] | None
) -> Callable[[RoundRecord], None]:
    def hook(record: RoundRecord) -> None:
        tracking.on_round(record)
        if on_round is not None:
            on_round(record)

    return hook


def _file_task(path: Path) -> str | None:
    """The task a model file's metadata names (None: none, or not a safetensors file)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            return (handle.metadata() or {}).get("task")
    except Exception:  # only decorates an error already being raised
        return None


def model_metadata(cfg: RunConfig, task: Task, round_num: int) -> dict[str, str]:
    """What rebuilds the model from model.safetensors alone (safetensors metadata is
    text): a built-in model is `fedveil.builtin_models.build_model(model, input_shape,
    num_classes)`; a custom task's model comes from its task function (`task_ref`)."""
    meta = {
        "format": "pt",  # the convention safetensors loaders check (e.g. transformers)
        "fedveil_version": __version__,
        "task": task.name,
        "input_shape": json.dumps(list(task.input_shape)),
        "num_classes": str(task.num_classes),
        "round": str(round_num),
    }
    if cfg.model.task is None:
        meta.update(model=cfg.model.name, dataset=cfg.data.dataset)
    else:
        meta["task_ref"] = cfg.model.task
    return meta
