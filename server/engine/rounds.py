"""The one engine: written once against the Transport interface, for every mode.

One server update is data through named steps (`RoundEngine.run_round`):
gather (the Scheduler: a sync round's cohort through the UpdateChannel, or FedBuff's
buffer of K arrivals) -> release (the release mechanism: none / central / distributed
DP) -> apply (server optimizer) -> evaluate -> after_apply (the scheduler: dispatch
with the new version) -> report (RoundReporter parts, annotators) -> persist (metrics,
private annex, checkpoint). Schedulers: scheduler.py; release mechanisms:
release_mechanism.py; the steps that need no engine state are in round_steps.py; the
record in round_record.py; drop reasons in drops.py.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedveil.config import RunConfig
from fedveil.flat_model import FlatModel
from fedveil.model_evaluation import evaluate
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError, all_finite
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.aggregation import PlainChannel, UpdateChannel, check_evaluate_reply
from fedveil.server.engine.barrier_scheduler import BarrierScheduler
from fedveil.server.engine.ledger_opening import DpSgdLedger
from fedveil.server.engine.optimizers import ServerOptimizer, make_optimizer
from fedveil.server.engine.release_mechanism import Release, ReleaseMechanism
from fedveil.server.engine.requests import ClientPrivacy, build_train_request
from fedveil.server.engine.robust import robust_summary
from fedveil.server.engine.round_record import PUBLIC_UNDER_DP, RoundRecord
from fedveil.server.engine.round_steps import Collected, persist, plain_release
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.sampling import CohortDraws, CohortSampler, SecretCohortSampler
from fedveil.server.engine.scheduler import Scheduler
from fedveil.server.engine.transport import (
    CentralEvaluator,
    ClientFailure,
    RoundReporter,
    Transport,
)
from fedveil.tasks import Task

# Other modules import the record and the DP-public keys from here.
__all__ = ["PUBLIC_UNDER_DP", "RoundEngine", "RoundRecord", "initial_model"]

log = logging.getLogger("fedveil.server")


def initial_model(task: Task, seed: int) -> torch.nn.Module:
    """The global model's initial weights: a function of the seed alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([seed, 0x1417]).generate_state(1)[0]))
        return task.model_fn()


class RoundEngine:
    """The one engine: every server update runs the same steps (`run_round`); what
    differs between sync rounds, FedBuff and SSP is the `scheduler` (scheduler.py),
    and what may be published is the release mechanism (`privacy`,
    release_mechanism.py)."""

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        transport: Transport,
        *,
        store: RunStore | None = None,
        channel: UpdateChannel | None = None,
        device: torch.device | str = "cpu",
        on_round: Callable[[RoundRecord], None] | None = None,
        privacy: ReleaseMechanism | None = None,
        model: FlatModel | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        """`model`: the global model, already built from `initial_model(task, cfg.seed)`
        (the run lifecycle builds it first, so a transport can know the model's size);
        None: built here on `device`. `scheduler`: None: the barrier (sync rounds);
        server.mode = async | ssp needs a BufferedScheduler (schedulers.make_scheduler)."""
        _check_client_ids(transport, task)
        self.cfg, self.task, self.transport, self.store = cfg, task, transport, store
        self.privacy = privacy
        # A DP-SGD-only run's ledger (opened, shown to devices, closed): witness_ledger().
        self.ledger_only: DpSgdLedger | None = None
        # Writes the model file the run publishes as of a closing record ('final' or
        # 'interrupted') and returns its SHA-256, which the record binds (None: no file):
        # bind_model(). Unset: the closing record binds no model.
        self.model_publisher: Callable[[str], str | None] | None = None
        self.stopped_reason: str | None = None
        self.public_stop_reason: str | None = None
        self.channel = channel or PlainChannel()
        self.on_round = on_round
        self.model = (
            model if model is not None else FlatModel(initial_model(task, cfg.seed), device)
        )
        self.weights = self.model.get()
        self.optimizer = _server_optimizer(cfg)
        self.secret_sampler, self.sampler = _cohort_samplers(cfg, task, privacy)
        self.eval_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xE7A1]))
        self.round = 0
        self.history: list[RoundRecord] = []
        # The first drop reason of this run, whole (the summary's `first_client_error`).
        self.first_client_error: str | None = None
        # The counts of the rounds before a resume (the checkpoint's), so that a resumed
        # run's summary counts the whole run, not only the rounds since the resume.
        self.earlier_counts: dict[str, Any] = {}
        # Facts from the parts around the engine (clients connected in a deployment,
        # epsilon spent under DP) go into the round's record before it is stored, so
        # they are part of the same durable line as the round itself.
        self.annotators: list[Callable[[RoundRecord], None]] = []
        # Simulated seconds since the run began (the rounds' sim_time_s, with a latency model).
        self.sim_clock = 0.0
        self.scheduler: Scheduler = scheduler or BarrierScheduler(cfg)
        if self.scheduler.mode != cfg.server.mode:
            raise ValueError(
                f"server.mode = {cfg.server.mode!r} needs its scheduler, not the "
                f"{self.scheduler.mode!r} one (schedulers.make_scheduler)"
            )
        self.scheduler.attach(self)

    # -- checkpoint -------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "weights": self.weights.cpu(),
            "optimizer": {k: v.cpu() for k, v in self.optimizer.state_dict().items()},
            "sampler": self.sampler.state(),
            "eval_rng": self.eval_rng.bit_generator.state,
            "sim_clock": self.sim_clock,
            "counts": self._run_counts(),
            **self.scheduler.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        # The scheduler first: it compares the checkpoint with the ledger as they were.
        self.scheduler.restore(state)
        device = self.model.device
        self.round = int(state["round"])
        self.weights = state["weights"].to(device)
        self.optimizer.load_state_dict({k: v.to(device) for k, v in state["optimizer"].items()})
        self.sampler.restore(state["sampler"])
        self.eval_rng.bit_generator.state = state["eval_rng"]
        self.sim_clock = float(state.get("sim_clock", 0.0))
        self.earlier_counts = dict(state.get("counts", {}))  # absent in older checkpoints
        self.first_client_error = self.earlier_counts.get("first_client_error")
        if self.privacy is not None and self.privacy.last_round > self.round:
            # Crashed between the ledger entry and the checkpoint: that release was
            # made (and is charged); its update is lost. Never run the round twice.
            log.warning(
                "ledger has round %d, checkpoint round %d: the lost round stays charged",
                self.privacy.last_round,
                self.round,
            )
            self.round = self.privacy.last_round

    # -- one round --------------------------------------------------------
    def witness_ledger(self, ledger: DpSgdLedger) -> None:
        """A DP-SGD-only run: every request carries this ledger's head; run() closes it."""
        self.ledger_only = ledger

    def bind_model(self, publisher: Callable[[str], str | None]) -> None:
        """`publisher(kind)` writes the model file published as of the ledger's closing
        record of `kind` and returns its SHA-256 (None: no model is published); run()
        calls it just before the close, which then records the hash (`model_sha256`)."""
        self.model_publisher = publisher

    def client_privacy(self) -> ClientPrivacy | None:
        """The release mechanism's part of a training request (or the DP-SGD ledger's)."""
        if self.privacy is not None:
            return self.privacy.client_fields()
        if self.ledger_only is not None:
            return self.ledger_only.client_fields()
        return None

    def train_request(self, round_num: int) -> Envelope:
        return build_train_request(self.cfg, round_num, self.weights, self.client_privacy())

    def run_round(self) -> RoundRecord | None:
        """One server update, as data through its steps (see ARCHITECTURE.md); None:
        the scheduler has nothing more to gather (engine.stopped_reason says why)."""
        round_num = self.round + 1
        gathered = self.scheduler.gather(round_num)
        if gathered is None:
            return None
        record, got = gathered.record, gathered.got
        release = self._release(round_num, got)
        self._apply(record, got, release)
        self.round = round_num
        self._evaluate(record)
        self.scheduler.after_apply(record)
        self._report(record, gathered.started)
        self.history.append(record)
        if self.store is not None:
            persist(self.store, record, gathered.annex)
            self.store.save_checkpoint(self.state())
        if self.on_round:
            self.on_round(record)
        return record

    def _release(self, round_num: int, got: Collected) -> Release | None:
        """What the update may publish. None: nothing (too few updates without DP; under
        distributed DP nothing unmasked and charged; any abort). Central DP always
        releases, noise alone when no update arrived: the accountant charges every round
        the sampling scheme ran."""
        if self.privacy is None:
            return plain_release(got, self.scheduler.min_contributors)
        if got.aborted is not None:
            return None
        return self.privacy.release(round_num, got.agg, self.model.size)

    def _apply(self, record: RoundRecord, got: Collected, release: Release | None) -> None:
        """The server optimizer's step on the released update, and the round's status."""
        agg = got.agg
        stepped = None
        if release is not None:
            record.extra.update(release.metrics)
            stepped = self._stepped(record.round, release.update.to(self.weights.device))
        if release is not None and stepped is not None:
            self.weights = stepped
            record.applied = True
            if self.privacy is None:
                assert agg is not None
                record.train_loss = agg.loss
            else:
                record.train_loss = None if agg is None or math.isnan(agg.loss) else agg.loss
                if agg is None or not agg.contributors:
                    record.extra["noise_only"] = True  # private: it reveals participation
            if self.cfg.client.dp_sgd_noise > 0:
                record.train_loss = None  # DP-SGD replies carry no loss (dpsgd_reply.py)
        elif (
            release is None
            and record.cohort_planned
            and got.aborted is None
            and self.privacy is None
        ):
            log.warning(
                "round %d: %d of %d clients aggregated, fewer than min_clients=%d; "
                "global model unchanged",
                record.round,
                record.cohort_aggregated,
                record.cohort_planned,
                self.cfg.server.min_clients,
            )
        record.extra.setdefault("status", "applied" if record.applied else "skipped")
        if self.privacy is not None and "epsilon" not in record.extra:
            record.extra["epsilon"] = self.privacy.epsilon()

    def _stepped(self, round_num: int, update: torch.Tensor) -> torch.Tensor | None:
        """The server optimizer's step on `update`, or None, with the optimizer's state as
        it was, when the update, the new weights or that state are not finite. Each
        reply is bounded (aggregation.sum_overflow), but a server learning rate or
        momentum can still carry a bounded update past float32: a NaN model would be
        every later round's."""
        saved = {k: v.clone() for k, v in self.optimizer.state_dict().items()}
        new = self.optimizer.step(self.weights, update) if all_finite(update) else None
        if new is not None and all(
            all_finite(t) for t in (new, *self.optimizer.state_dict().values())
        ):
            return new
        self.optimizer.load_state_dict(saved)
        log.error(
            "round %d: the server update is not finite (NaN or infinite) after the %s "
            "step; not applied: the model and the optimizer's state are kept",
            round_num,
            self.optimizer.name,
        )
        return None

    def _report(self, record: RoundRecord, start: float) -> None:
        """Facts about the round that only the parts around the engine know."""
        # A transport or channel may add facts about the round only it knows (simulated
        # dropouts; the secure-aggregation mode and parameters).
        for part in (self.transport, self.channel):
            if isinstance(part, RoundReporter):
                record.extra.update(part.round_report(record.round))
        if "sim_time_s" in record.extra and "sim_clock_s" not in record.extra:
            self.sim_clock += float(record.extra["sim_time_s"])
            record.extra["sim_clock_s"] = round(self.sim_clock, 6)
        record.duration_s = time.perf_counter() - start
        for annotate in self.annotators:
            annotate(record)

    def _evaluate(self, record: RoundRecord) -> None:
        e = self.cfg.eval
        last = record.round == self.cfg.server.rounds
        if (
            self.task.test_data is not None
            and e.central_every
            and (record.round % e.central_every == 0 or last)
        ):
            record.test_loss, record.test_accuracy = self._evaluate_central(record.round)
        if e.federated_every and (record.round % e.federated_every == 0 or last):
            self._evaluate_federated(record)

    def _evaluate_central(self, round_num: int) -> tuple[float, float]:
        """The global model on the task's test set: (loss, accuracy)."""
        batch_size = self.cfg.eval.batch_size
        # A transport with idle workers (the in-process engine's) may evaluate for us.
        result = None
        if isinstance(self.transport, CentralEvaluator):
            result = self.transport.evaluate_central(self.weights, round_num, batch_size)
        if result is None:
            assert self.task.test_data is not None
            x, y = self.task.test_data
            result = evaluate(self.model, self.weights, x, y, self.task.loss_fn, batch_size)
        return result[0], result[1]

    def _evaluate_federated(self, record: RoundRecord) -> None:
        """The global model on a sample of clients' own data, weighted by their examples."""
        k = min(self.cfg.eval.federated_clients, self.task.num_clients)
        if self.secret_sampler is not None:
            chosen = self.secret_sampler.choice(b"federated-eval", record.round, k)
        else:
            chosen = sorted(
                int(c) for c in self.eval_rng.choice(self.task.num_clients, k, replace=False)
            )
        req = Envelope(Kind.EVALUATE, record.round, {}, {F.MODEL: self.weights})
        replies = self.transport.exchange({c: req for c in chosen}, None)
        n_total, loss_sum, correct = 0, 0.0, 0.0
        refused: list[str] = []
        for cid in chosen:
            r = replies.get(cid)
            if r is None or isinstance(r, ClientFailure):
                continue
            try:  # a client's claims: checked, never trusted into the record (or a crash)
                n, accuracy, loss = check_evaluate_reply(r, record.round)
            except MessageError as exc:
                refused.append(str(exc))
                continue
            n_total += n
            loss_sum += loss * n
            correct += accuracy * n
        if refused:  # the checks only: no client ids (DP runs publish no participation)
            log.warning(
                "round %d: federated evaluation refused replies: %s",
                record.round,
                "; ".join(sorted(set(refused)))[:500],
            )
        if n_total:
            record.federated_loss = loss_sum / n_total
            record.federated_accuracy = correct / n_total

    # -- whole run --------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """All remaining server updates, while the scheduler admits them and has them to
        gather. Under DP the ledger then gets its signed closing record: 'final' when
        the run ends (rounds done, budget or caps spent), 'interrupted' when it is
        stopped or fails (a resume continues it)."""
        start = time.perf_counter()
        self.scheduler.begin()
        try:
            while self.round < self.cfg.server.rounds and self.scheduler.admits_next():
                if self.run_round() is None:
                    break
        except BaseException as exc:
            self._close_ledger("interrupted", f"{type(exc).__name__}: {exc}"[:200])
            self.scheduler.end(failed=True)
            raise
        # The public ledger states the public reason (async: the cap, never failure counts).
        self._close_ledger("final", self.public_stop_reason or self.stopped_reason)
        summary = self.summary(time.perf_counter() - start)
        self.scheduler.end(failed=False)
        return summary

    def _close_ledger(self, kind: str, reason: str | None) -> None:
        closer = self.privacy if self.privacy is not None else self.ledger_only
        if closer is None:
            return
        try:
            # The model first: a crash between the two leaves a ledger without a close
            # (read as truncated), never a record naming a file that was not written.
            digest = self.model_publisher(kind) if self.model_publisher is not None else None
            closer.close(kind, self.round, reason, model_sha256=digest)
        except Exception as error:  # an original failure matters more
            if kind == "final":
                raise
            log.warning("could not write the ledger's interruption record: %s", error)

    def summary(self, wall_s: float) -> dict[str, Any]:
        last_eval = next((r for r in reversed(self.history) if r.test_accuracy is not None), None)
        return {
            "rounds": self.round,
            "clients": self.task.num_clients,
            "per_round": self.cfg.server.per_round,
            "sampling": self.cfg.server.sampling,
            "task": self.task.name,
            "transport": self.cfg.transport,
            "seed": self.cfg.seed,
            "test_accuracy": None if last_eval is None else last_eval.test_accuracy,
            "test_loss": None if last_eval is None else last_eval.test_loss,
            **self._counts(),
            "wall_s": round(wall_s, 3),
            "model_parameters": self.model.size,
            "stopped_reason": self.stopped_reason,
            **self._privacy_summary(),
            **self._dp_sgd_summary(),
            **self.scheduler.summary(),
        }

    def _dp_sgd_summary(self) -> dict[str, Any]:
        """DP-SGD's public figures: its parameters. Each client's epsilon depends on its
        own n (each device accounts and caps its own); the simulation's per-client worst
        case is in the private annex (`dp_sgd_epsilon_max`, private/rounds.jsonl)."""
        c = self.cfg.client
        if c.dp_sgd_noise == 0:
            return {}
        return {"dp_sgd_noise": c.dp_sgd_noise, "dp_sgd_clip": c.dp_sgd_clip}

    def _counts(self) -> dict[str, Any]:
        if self.cfg.publishes_privately:
            # How many rounds applied and how many clients dropped reveal participation.
            return {}
        counts = self._run_counts()
        return {
            **counts,
            "client_errors": dict(Counter(counts["client_errors"]).most_common()),
            **robust_summary(self.cfg.server.aggregator, self.history),
        }

    def _run_counts(self) -> dict[str, Any]:
        """Applied rounds, drops and drop reasons over the whole run: the checkpoint's
        (earlier sessions) plus this session's rounds."""
        earlier = self.earlier_counts
        errors: Counter[str] = Counter(earlier.get("client_errors", {}))
        for r in self.history:
            errors.update(r.extra.get("drops_by_reason", {}))
        return {
            "rounds_applied": int(earlier.get("rounds_applied", 0))
            + sum(r.applied for r in self.history),
            "dropped_total": int(earlier.get("dropped_total", 0))
            + sum(r.dropped for r in self.history),
            "client_errors": dict(errors),
            "first_client_error": self.first_client_error,
        }

    def _privacy_summary(self) -> dict[str, Any]:
        if self.privacy is None:
            return {"dp": "none"}
        c = self.privacy.config
        return {
            "dp": c.mechanism,
            "epsilon": self.privacy.epsilon(),
            # The bound, never the realised max (a participation count: private annex).
            "epsilon_coordinator_bound": self.privacy.coordinator_bound(),
            "budget_against": self.privacy.budget_against,
            "cohort_source": self.sampler.source,
            "delta": c.delta,
            "budget_epsilon": c.budget_epsilon,
            "noise_multiplier": c.noise_multiplier,
            "sampling_rate": c.sampling_rate,
            "neighbouring": c.neighbouring,
        }


# -- construction ---------------------------------------------------------------------
def _check_client_ids(transport: Transport, task: Task) -> None:
    ids = transport.client_ids()
    if isinstance(ids, range):
        # In-process transports declare a range: compared as one, with no list of a
        # million ints at start-up (the population benchmark's peak memory).
        ok = ids == range(task.num_clients)
    else:
        ok = sorted(ids) == list(range(task.num_clients))
    if not ok:
        raise ValueError(
            f"transport has {len(ids)} clients, the task has {task.num_clients}; "
            "client ids must be 0..num_clients-1"
        )


def _server_optimizer(cfg: RunConfig) -> ServerOptimizer:
    s = cfg.server
    return make_optimizer(
        s.optimizer,
        lr=s.server_lr,
        momentum=s.server_momentum,
        beta1=s.beta1,
        beta2=s.beta2,
        tau=s.tau,
    )


def _cohort_samplers(
    cfg: RunConfig, task: Task, privacy: ReleaseMechanism | None
) -> tuple[SecretCohortSampler | None, CohortDraws]:
    """(the secret sampler or None, the sampler the rounds draw from).

    A mechanism whose guarantee constrains who may take part gives its own sampler
    (DP-FTRL: its participation schema). Otherwise, under DP the cohorts must stay
    secret (amplification by sampling depends on it), so they come from a secret key,
    not the public seed, unless the run asks for seeded cohorts (then it is accounted
    with q = 1)."""
    s = cfg.server
    constrained = privacy.cohort_sampler() if privacy is not None else None
    if constrained is not None:
        return None, constrained
    if privacy is not None and privacy.cohorts_secret:
        secret = SecretCohortSampler(
            task.num_clients, s.sampling, s.per_round, cfg.poisson_rate, privacy.cohort_key
        )
        return secret, secret
    seeded = CohortSampler(task.num_clients, s.sampling, s.per_round, cfg.poisson_rate, cfg.seed)
    return None, seeded
