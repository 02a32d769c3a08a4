"""The round engine: written once against the Transport interface.

One round: sample a cohort, send the global model and the local-training
config, collect the cohort's weighted update sum through an UpdateChannel,
average, take a server-optimizer step, evaluate, record, checkpoint.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from fedveil.config import RunConfig
from fedveil.evaluation import evaluate
from fedveil.params import FlatModel
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.aggregation import Aggregate, PlainChannel, UpdateChannel
from fedveil.server.engine.dpsgd_accounting import ClientDpSgdAccountant
from fedveil.server.engine.optimizers import make_optimizer
from fedveil.server.engine.outcome import Aborted
from fedveil.server.engine.privacy_stage import CentralDP, Release
from fedveil.server.engine.requests import build_train_request
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.sampling import CohortSampler, SecretCohortSampler
from fedveil.server.engine.transport import (
    CentralEvaluator,
    ClientFailure,
    RoundReporter,
    Transport,
)
from fedveil.tasks import Task

log = logging.getLogger("fedveil.server")


@dataclass
class RoundRecord:
    round: int
    cohort_planned: int
    cohort_aggregated: int
    dropped: int
    applied: bool
    train_loss: float | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None
    federated_loss: float | None = None
    federated_accuracy: float | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        return d

    def public_json(self) -> dict[str, Any]:
        """What a DP run may publish about the round: accounted figures and the server's
        own evaluation. Counts, drops, client losses and federated metrics come from
        clients' data or reveal participation: they go to the private annex only."""
        full = self.to_json()
        return {k: v for k, v in full.items() if k in PUBLIC_UNDER_DP}


# Round-record keys a DP run publishes (metrics.jsonl, the API, the dashboard).
PUBLIC_UNDER_DP = frozenset(
    {
        "round",
        "status",
        "test_loss",
        "test_accuracy",
        "duration_s",
        "epsilon",
        "epsilon_coordinator_max",
        "clip_norm",
        "next_clip_norm",
        "noise_multiplier",
        "secagg_threat",
        "secagg_neighbors",
        "secagg_threshold",
        "dp_sgd_epsilon_max",
        "clients_connected",
    }
)


def initial_model(task: Task, seed: int) -> torch.nn.Module:
    """The global model's initial weights: a function of the seed alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence([seed, 0x1417]).generate_state(1)[0]))
        return task.model_fn()


class RoundEngine:
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
        privacy: CentralDP | None = None,
        model: FlatModel | None = None,
    ) -> None:
        """`model`: the global model, already built from `initial_model(task, cfg.seed)`
        (the run lifecycle builds it first, so a transport can know the model's size);
        None: built here on `device`."""
        self.cfg, self.task, self.transport, self.store = cfg, task, transport, store
        self.privacy = privacy
        self.stopped_reason: str | None = None
        self.channel = channel or PlainChannel()
        self.on_round = on_round
        self.model = (
            model if model is not None else FlatModel(initial_model(task, cfg.seed), device)
        )
        self.weights = self.model.get()
        s = cfg.server
        self.optimizer = make_optimizer(
            s.optimizer,
            lr=s.server_lr,
            momentum=s.server_momentum,
            beta1=s.beta1,
            beta2=s.beta2,
            tau=s.tau,
        )
        ids = list(transport.client_ids())
        if sorted(ids) != list(range(task.num_clients)):
            raise ValueError(
                f"transport has {len(ids)} clients, the task has {task.num_clients}; "
                "client ids must be 0..num_clients-1"
            )
        # Under DP the cohorts must stay secret (amplification by sampling depends on it),
        # so they come from a secret key, not the public seed, unless the run asks for
        # seeded cohorts (then it is accounted with q = 1).
        self.secret_sampler: SecretCohortSampler | None = None
        self.sampler: CohortSampler | SecretCohortSampler
        if privacy is not None and privacy.cohorts_secret:
            self.secret_sampler = SecretCohortSampler(
                task.num_clients, s.sampling, s.per_round, cfg.poisson_rate, privacy.cohort_key
            )
            self.sampler = self.secret_sampler
        else:
            self.sampler = CohortSampler(
                task.num_clients, s.sampling, s.per_round, cfg.poisson_rate, cfg.seed
            )
        self.dp_sgd: ClientDpSgdAccountant | None = None
        if cfg.client.dp_sgd_noise > 0 and task.client_sizes is not None:
            self.dp_sgd = ClientDpSgdAccountant(
                cfg.client.dp_sgd_noise,
                cfg.client.batch_size,
                max(1, cfg.client.local_epochs),
                task.client_sizes,
                cfg.dp.delta,
            )
        self.eval_rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xE7A1]))
        self.round = 0
        # The next round's cohort, drawn one round ahead so the channel can prepare it
        # (secure aggregation's key stages); the draws and their order are unchanged.
        self.upcoming: list[int] | None = None
        self.history: list[RoundRecord] = []
        # Facts from the parts around the engine (clients connected in a deployment,
        # epsilon spent under DP) go into the round's record before it is stored, so
        # they are part of the same durable line as the round itself.
        self.annotators: list[Callable[[RoundRecord], None]] = []

    # -- checkpoint -------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "weights": self.weights.cpu(),
            "optimizer": {k: v.cpu() for k, v in self.optimizer.state_dict().items()},
            "sampler": self.sampler.state(),
            "eval_rng": self.eval_rng.bit_generator.state,
            "upcoming": self.upcoming,
        }

    def restore(self, state: dict[str, Any]) -> None:
        device = self.model.device
        self.round = int(state["round"])
        self.weights = state["weights"].to(device)
        self.optimizer.load_state_dict({k: v.to(device) for k, v in state["optimizer"].items()})
        self.sampler.restore(state["sampler"])
        self.eval_rng.bit_generator.state = state["eval_rng"]
        upcoming = state.get("upcoming")  # absent in checkpoints of older versions
        self.upcoming = None if upcoming is None else [int(c) for c in upcoming]
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
    def train_request(self, round_num: int) -> Envelope:
        privacy = None if self.privacy is None else self.privacy.client_fields()
        return build_train_request(self.cfg, round_num, self.weights, privacy)

    def run_round(self) -> RoundRecord:
        round_num = self.round + 1
        start = time.perf_counter()
        cohort = self.upcoming if self.upcoming is not None else self.sampler.sample()
        self.upcoming = self.sampler.sample() if round_num < self.cfg.server.rounds else None
        record = RoundRecord(round_num, len(cohort), 0, 0, applied=False)
        outcome: Aggregate | Aborted | None = None
        if cohort:
            request = self.train_request(round_num)
            requests = {cid: request for cid in cohort}
            timeout = self.cfg.server.round_timeout or None
            outcome = self.channel.collect(
                self.transport, requests, self.model.size, timeout, upcoming=self.upcoming
            )
        agg = outcome if isinstance(outcome, Aggregate) else None
        aborted = outcome if isinstance(outcome, Aborted) else None
        dropped = agg.dropped if agg is not None else aborted.dropped if aborted else {}
        # Under DP, who dropped and why is the operator's alone (private annex, debug log).
        level = logging.DEBUG if self.privacy is not None else logging.WARNING
        for cid, reason in dropped.items():
            log.log(level, "round %d: client %d dropped: %s", round_num, cid, reason)
        if agg is not None:
            record.dropped = len(agg.dropped)
            record.cohort_aggregated = len(agg.contributors)
            if self.dp_sgd is not None:
                record.extra["dp_sgd_epsilon_max"] = self.dp_sgd.record_round(agg.contributors)
        else:
            record.dropped = len(cohort)
        if aborted is not None:
            # Aborted before unmasking: nothing revealed, applied or charged. After it: the
            # sum may have been seen; under distributed DP it was charged first.
            record.extra.update(status="aborted", aborted_stage=aborted.stage)
            record.extra["abort_reason"] = aborted.reason
        # None: nothing to publish (central DP always releases; distributed DP does not
        # when nothing was unmasked and charged).
        released: Release | None = None
        if self.privacy is not None and aborted is None:
            released = self.privacy.release(round_num, agg, self.model.size)
        if released is not None:
            record.extra.update(released.metrics)
            self.weights = self.optimizer.step(
                self.weights, released.update.to(self.weights.device)
            )
            record.applied = True
            record.train_loss = None if agg is None or math.isnan(agg.loss) else agg.loss
        elif (
            self.privacy is None
            and agg is not None
            and record.cohort_aggregated >= self.cfg.server.min_clients
        ):
            update = agg.mean.to(self.weights.device)
            self.weights = self.optimizer.step(self.weights, update)
            record.applied = True
            record.train_loss = agg.loss
        elif cohort and aborted is None and self.privacy is None:
            log.warning(
                "round %d: %d of %d clients aggregated, fewer than min_clients=%d; "
                "global model unchanged",
                round_num,
                record.cohort_aggregated,
                len(cohort),
                self.cfg.server.min_clients,
            )
        record.extra.setdefault("status", "applied" if record.applied else "skipped")
        if self.privacy is not None and "epsilon" not in record.extra:
            record.extra["epsilon"] = self.privacy.epsilon()
        self.round = round_num
        self._evaluate(record)
        # A transport or channel may add facts about the round only it knows (simulated
        # dropouts; the secure-aggregation mode and parameters).
        for part in (self.transport, self.channel):
            if isinstance(part, RoundReporter):
                record.extra.update(part.round_report(round_num))
        record.duration_s = time.perf_counter() - start
        for annotate in self.annotators:
            annotate(record)
        self.history.append(record)
        if self.store is not None:
            if self.privacy is None:
                self.store.append_metrics(record.to_json())
            else:
                private = record.to_json()
                private.update(
                    cohort=cohort, dropped_reasons={str(c): r for c, r in dropped.items()}
                )
                if agg is not None:
                    private["survivors"] = list(agg.contributors)
                self.store.append_private(private)
                self.store.append_metrics(record.public_json())
            self.store.save_checkpoint(self.state())
        if self.on_round:
            self.on_round(record)
        return record

    def _evaluate(self, record: RoundRecord) -> None:
        e = self.cfg.eval
        last = record.round == self.cfg.server.rounds
        if (
            self.task.test_data is not None
            and e.central_every
            and (record.round % e.central_every == 0 or last)
        ):
            # A transport with idle workers (the in-process engine's) may evaluate for us.
            result = None
            if isinstance(self.transport, CentralEvaluator):
                result = self.transport.evaluate_central(self.weights, record.round, e.batch_size)
            if result is None:
                x, y = self.task.test_data
                result = evaluate(self.model, self.weights, x, y, self.task.loss_fn, e.batch_size)
            record.test_loss, record.test_accuracy = result[0], result[1]
        if e.federated_every and (record.round % e.federated_every == 0 or last):
            k = min(e.federated_clients, self.task.num_clients)
            if self.secret_sampler is not None:
                chosen = self.secret_sampler.choice(b"federated-eval", record.round, k)
            else:
                chosen = sorted(
                    int(c) for c in self.eval_rng.choice(self.task.num_clients, k, replace=False)
                )
            req = Envelope(Kind.EVALUATE, record.round, {}, {F.MODEL: self.weights})
            replies = self.transport.exchange({c: req for c in chosen}, None)
            n_total, loss_sum, correct = 0, 0.0, 0.0
            for cid in chosen:
                r = replies.get(cid)
                if r is None or isinstance(r, ClientFailure):
                    continue
                n = int(r.config.get(F.NUM_EXAMPLES, 0))
                if n > 0:
                    n_total += n
                    loss_sum += float(r.config[F.LOSS]) * n
                    correct += float(r.config["accuracy"]) * n
            if n_total:
                record.federated_loss, record.federated_accuracy = (
                    loss_sum / n_total,
                    correct / n_total,
                )

    # -- whole run --------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """All remaining rounds. Under DP the ledger then gets its signed closing record:
        'final' when the run ends (rounds done or budget spent), 'interrupted' when it is
        stopped or fails (a resume continues it)."""
        start = time.perf_counter()
        try:
            while self.round < self.cfg.server.rounds:
                if self.privacy is not None:
                    allowed, eps = self.privacy.admits_next_round()
                    if not allowed:
                        self.stopped_reason = (
                            f"privacy budget: round {self.round + 1} would bring epsilon "
                            f"({self.privacy.budget_against}) to {eps:.4g} > budget "
                            f"{self.privacy.config.budget_epsilon:g}; stopped"
                        )
                        log.warning(self.stopped_reason)
                        break
                self.run_round()
        except BaseException as exc:
            if self.privacy is not None:
                reason = f"{type(exc).__name__}: {exc}"[:200]
                try:
                    self.privacy.close("interrupted", self.round, reason)
                except Exception as close_error:  # the original failure matters more
                    log.warning("could not write the ledger's interruption record: %s", close_error)
            raise
        if self.privacy is not None:
            self.privacy.close("final", self.round, self.stopped_reason)
        return self.summary(time.perf_counter() - start)

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
            **({"dp_sgd_epsilon_max": self.dp_sgd.worst} if self.dp_sgd else {}),
        }

    def _counts(self) -> dict[str, Any]:
        if self.privacy is not None:
            # How many rounds applied and how many clients dropped reveal participation.
            return {}
        return {
            "rounds_applied": sum(r.applied for r in self.history),
            "dropped_total": sum(r.dropped for r in self.history),
        }

    def _privacy_summary(self) -> dict[str, Any]:
        if self.privacy is None:
            return {"dp": "none"}
        c = self.privacy.config
        return {
            "dp": c.mechanism,
            "epsilon": self.privacy.epsilon(),
            "epsilon_coordinator_max": self.privacy.coordinator_epsilon(),
            "budget_against": self.privacy.budget_against,
            "cohort_source": "csprng" if self.secret_sampler is not None else "seed",
            "delta": c.delta,
            "budget_epsilon": c.budget_epsilon,
            "noise_multiplier": c.noise_multiplier,
            "sampling_rate": c.sampling_rate,
            "neighbouring": c.neighbouring,
        }
