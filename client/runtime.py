"""The client's side of a round, free of any transport.

`ClientRuntime.handle` takes a request Envelope for one client and returns its
reply; the Flower ClientApp, the edge entry point and the in-process engine
are thin adapters around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedveil.client.dpsgd_budget import DpSgdBudget
from fedveil.client.dpsgd_reply import dp_sgd_reply
from fedveil.client.trained_update import check_trained
from fedveil.client.training import (
    DpSgdResult,
    LocalTraining,
    Trainer,
    dp_sgd_plan,
    train_local,
    train_local_dp_sgd,
)
from fedveil.flat_model import FlatModel
from fedveil.model_evaluation import evaluate
from fedveil.privacy.dp.clipping import clip_update
from fedveil.privacy.dp.evaluation import contribution
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.privacy.secagg.identity_keys import ClientIdentity
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.kinds import SECAGG, Kind, trains
from fedveil.protocol.numbers import request_int, request_number
from fedveil.protocol.piggyback import detach, join_replies
from fedveil.tasks import Task

if TYPE_CHECKING:
    from fedveil.client.ftrl_participation import ParticipationGuard
    from fedveil.client.masked_input_counts import RunMaskedInputs
    from fedveil.client.own_share import OwnShareAccount
    from fedveil.client.plan_pin import PinnedPlan
    from fedveil.config import RunConfig
    from fedveil.privacy.dp.distributed_plan import DistributedDpPlan
    from fedveil.privacy.secagg.session_floor import SessionFloor

TRAIN_FIELDS = F.HYPERPARAMETERS


def client_generator(seed: int, round_num: int, client_id: int) -> torch.Generator:
    """The client's batch-order generator: a function of (seed, round, client) only."""
    state = np.random.SeedSequence([seed, round_num, client_id, 0xC1]).generate_state(2)
    g = torch.Generator()
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g


# The hyper-parameters' limits (as the run config's validator has them for the server): a
# request outside them, or with a non-number, is refused naming the field.
_TRAINING_LIMITS: dict[str, dict[str, Any]] = {
    F.LOCAL_EPOCHS: {"at_least": 0},
    F.LOCAL_STEPS: {"at_least": 0},
    F.BATCH_SIZE: {"at_least": 1},
    F.LR: {"above": 0.0},
    F.MOMENTUM: {"at_least": 0.0, "at_most": 1.0},
    F.WEIGHT_DECAY: {"at_least": 0.0},
    F.PROX_MU: {"at_least": 0.0},
}


def parse_training(msg: Envelope) -> LocalTraining:
    values: dict[str, Any] = {}
    where = f"{msg.kind} message"
    for key, kind in TRAIN_FIELDS:
        limits = _TRAINING_LIMITS.get(key, {})
        if kind is int:
            values[key] = request_int(msg.config, key, where=where, **limits)
        else:
            values[key] = request_number(msg.config, key, where=where, **limits)
    hp = LocalTraining(**values)
    if hp.local_epochs == 0 and hp.local_steps == 0:
        raise MessageError("train message: local_epochs and local_steps are both 0")
    return hp


IdentitySource = Callable[[int], ClientIdentity]


def participation_limit(cfg: RunConfig) -> tuple[int, str]:
    """The most masked inputs a client's run config allows it under distributed DP, and the
    setting that says so: one per round of a synchronous run, the cap of an asynchronous
    one (which the config requires under DP: fedveil/config/async_dp.py)."""
    from fedveil.config.async_dp import is_async, participation_cap

    if is_async(cfg):
        return participation_cap(cfg), f"server.max_participations = {participation_cap(cfg)}"
    return cfg.server.rounds, f"server.rounds = {cfg.server.rounds}"


class ClientRuntime:
    """Trains and evaluates for any client of `task`, reusing one model instance.

    `identities` gives a client's secure-aggregation identity (key and roster), which
    malicious-server sessions need; None: this runtime has none. `run_id` is the run this
    runtime serves, from its own context (a deployment's Flower run id, see
    `flower_run_id`): secure-aggregation sessions naming another run are refused.
    `run_config` is the run's config as this client holds it (in simulation the run's own,
    on a device the one it accepted): under distributed DP the client computes the run's
    noise-share parameters and survivor floor from it, refuses any request that is not
    that plan (client/plan_pin.py: encoding, noise, clip, weighting, kind), and reveals
    no unmasking share below that floor. `max_own_share_epsilon`: refuse a masked input
    that would bring a client's own-share-only epsilon against the coordinator above
    this (client/own_share.py; None: no cap). `trainer` runs local training
    (the in-process engine passes one that hands back results it computed for several
    clients at once: same signature, same arithmetic). `dp_sgd_budget`: a device's own
    DP-SGD accounting (client/dpsgd_budget.py), charged before each DP-SGD round.
    `masked_inputs`: where this run's masked inputs are counted under distributed DP (a
    device's state directory, client/masked_input_counts.py; None: in memory)."""

    def __init__(
        self,
        task: Task,
        device: torch.device | str = "cpu",
        identities: IdentitySource | None = None,
        *,
        run_id: bytes = SIMULATION_RUN_ID,
        run_config: RunConfig | None = None,
        on_ledger_head: Callable[[str], None] | None = None,
        trainer: Trainer = train_local,
        dp_sgd_budget: DpSgdBudget | None = None,
        max_own_share_epsilon: float | None = None,
        participation: ParticipationGuard | None = None,
        masked_inputs: RunMaskedInputs | None = None,
    ) -> None:
        self.task = task
        self.identities = identities
        self.run_id = run_id
        self.run_config = run_config
        # Receives the privacy-ledger head a request carries (a device keeps it as a witness).
        self.on_ledger_head = on_ledger_head
        self._dp_plan: DistributedDpPlan | None = None
        self._pin: PinnedPlan | None = None
        self._floor: SessionFloor | None = None
        # Under distributed DP: each client's own-share-only epsilon, capped (client/own_share.py).
        self.max_own_share_epsilon = max_own_share_epsilon
        self.own_share: OwnShareAccount | None = None
        self.masked_inputs = masked_inputs
        self.model = FlatModel(task.model_fn(), device)
        self.trainer = trainer
        self.dp_sgd_budget = dp_sgd_budget
        # DP-FTRL: this client's own participation count and separation (a device's is
        # kept in its state directory; None: counted in memory by this runtime).
        self.participation = participation

    def handle(self, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope:
        """The reply to `msg`; a request carrying a rider gets both answered, each on
        its own (one failing does not fail the other)."""
        primary, rider = detach(msg)
        if rider is None:
            return self.handle_one(client_id, msg, state)
        return join_replies(
            self._attempt(client_id, primary, state), self._attempt(client_id, rider, state), msg
        )

    def _attempt(self, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope | str:
        try:
            return self.handle_one(client_id, msg, state)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    def handle_one(self, client_id: int, msg: Envelope, state: dict[str, Any]) -> Envelope:
        head = msg.config.get(WITNESS_CONFIG_KEY)
        if head is not None and self.on_ledger_head is not None:
            if not isinstance(head, str):
                raise MessageError(f"{WITNESS_CONFIG_KEY}={head!r}: expected a JSON string")
            try:
                self.on_ledger_head(head)
            except ValueError as exc:
                raise MessageError(str(exc)) from None
        self._enforce_plan(client_id, msg)
        if msg.kind == Kind.HELLO:
            hello = {F.CLIENT_ID: client_id, F.SIZE: self.model.size}
            return Envelope(Kind.HELLO, msg.round, hello)
        if msg.kind == Kind.TRAIN:
            return self._train(client_id, msg)
        if msg.kind == Kind.EVALUATE:
            return self._evaluate(client_id, msg)
        if msg.kind.startswith(SECAGG):
            from fedveil.client.secagg_stages import handle_secagg

            identity = None if self.identities is None else self.identities(client_id)
            plan = self.distributed_dp_plan()
            return handle_secagg(
                client_id,
                msg,
                state,
                self._masked_input,
                identity,
                run_id=self.run_id,
                min_survivors=0 if plan is None else plan.min_survivors,
                expected_skellam=None if plan is None else plan.params,
                floor=self.session_floor(),
            )
        raise MessageError(f"unknown message kind {msg.kind!r}")

    def _enforce_plan(self, client_id: int, msg: Envelope) -> None:
        """Under distributed DP, refuse what is not the plan this client holds, whatever the
        request says (client/plan_pin.py), and a masked input past its own-share cap.
        Under DP-FTRL, refuse training beyond the schema (client/ftrl_participation.py).
        Under secure aggregation, refuse a plain train (its update in the clear)."""
        cfg = self.run_config
        if cfg is not None and cfg.secagg.enabled and cfg.dp.mechanism != "distributed":
            # (distributed DP refuses it below, naming its noise share)
            from fedveil.client.plan_pin import refuse_unmasked_training

            refuse_unmasked_training(msg)
        if self.run_config is not None and self.run_config.dp.mechanism == "ftrl":
            if trains(msg.kind, msg.config):
                if self.participation is None:
                    from fedveil.client.ftrl_participation import ParticipationGuard

                    self.participation = ParticipationGuard()
                self.participation.admit(client_id, self.run_config, msg)
            return
        if self.run_config is None or self.run_config.dp.mechanism != "distributed":
            return
        from fedveil.client.plan_pin import refuse_in_the_clear

        refuse_in_the_clear(msg)
        if msg.kind == Kind.SECAGG_MASKED_INPUT:
            pin = self.pinned_plan()
            assert pin is not None and self.own_share is not None
            pin.check_masked_input(msg)

    def session_floor(self) -> SessionFloor | None:
        """The threat model of this client's own run config, which every secure-aggregation
        session must meet (privacy/secagg/session_floor.py; None: it was given no config)."""
        cfg = self.run_config
        if cfg is None:
            return None
        if self._floor is None:
            from fedveil.client.secagg_floors import session_floor_of

            self._floor = session_floor_of(cfg, self.task.num_clients)
        return self._floor

    def pinned_plan(self) -> PinnedPlan | None:
        """The distributed-DP plan this client holds and checks every request against
        (None: the run is not distributed DP, or this client was given no run config)."""
        plan = self.distributed_dp_plan()
        if plan is None:
            return None
        if self._pin is None:
            from fedveil.client.own_share import OwnShareAccount
            from fedveil.client.plan_pin import PinnedPlan

            assert self.run_config is not None
            self.own_share = OwnShareAccount(
                plan,
                self.run_config.dp.delta,
                self.max_own_share_epsilon,
                participation_limit(self.run_config),
                self.masked_inputs,
            )
            self._pin = PinnedPlan(plan, float(self.run_config.dp.clip_norm))
        return self._pin

    def distributed_dp_plan(self) -> DistributedDpPlan | None:
        """The run's distributed-DP plan as this client computes it from its own run config
        (once per run); None when the run is not distributed DP or no config was given."""
        cfg = self.run_config
        if cfg is None or cfg.dp.mechanism != "distributed":
            return None
        if self._dp_plan is None:
            from fedveil.privacy.dp.plan import plan_distributed_dp

            # The model size as the server's pipeline counts it (parameters only).
            model_size = sum(p.numel() for p in self.task.model_fn().parameters())
            try:
                self._dp_plan = plan_distributed_dp(
                    cfg.dp_parameters(), model_size, self.task.num_clients
                )
            except ValueError as exc:
                raise MessageError(f"this client's distributed-DP plan: {exc}") from None
        return self._dp_plan

    def _global(self, msg: Envelope) -> torch.Tensor:
        return msg.tensor(F.MODEL, numel=self.model.size)

    def _train(self, client_id: int, msg: Envelope) -> Envelope:
        reply, delta = self._train_update(client_id, msg)
        return Envelope(Kind.TRAIN, msg.round, reply, {F.DELTA: delta})

    def _train_update(self, client_id: int, msg: Envelope) -> tuple[dict[str, Any], torch.Tensor]:
        """Train on the client's data; the reply fields and the (clipped) update."""
        hp = parse_training(msg)
        seed = request_int(msg.config, F.SEED, at_least=0, where=f"{msg.kind} message")
        global_vector = self._global(msg)
        data = self.task.client_data(client_id)
        where = f"{msg.kind} message"
        if self.run_config is not None:  # its DP-SGD, whatever the request says
            from fedveil.client.dpsgd_pin import check_dp_sgd_request

            check_dp_sgd_request(self.run_config, msg, hp, len(data))
        # A NaN must not switch DP-SGD off: the noise is a finite number >= 0 or refused.
        dp_noise = request_number(
            msg.config, F.DP_SGD_NOISE, at_least=0.0, default=0.0, where=where
        )
        if dp_noise > 0:
            clip = request_number(msg.config, F.DP_SGD_CLIP, above=0.0, where=where)
            reply = dp_sgd_reply(msg.config)  # refuses example weighting before training
            if self.dp_sgd_budget is not None:  # charged from this client's own n
                rate, steps = dp_sgd_plan(hp, len(data))
                self.dp_sgd_budget.admit(msg.round, dp_noise, rate, steps)
            result = train_local_dp_sgd(
                self.task.model_fn(),
                global_vector,
                data.x,
                data.y,
                hp,
                self.task.loss_fn,
                dp_noise,
                clip,
            )
            if self.dp_sgd_budget is not None:
                self.dp_sgd_budget.check_ran(result.steps)
            delta_device = self.model.device
        else:
            result = self.trainer(
                self.model,
                global_vector,
                data.x,
                data.y,
                hp,
                self.task.loss_fn,
                client_generator(seed, msg.round, client_id),
            )
        delta = result.delta
        dp_sgd = isinstance(result, DpSgdResult)
        # Before the clip and any encoding: a diverged update is refused, never sent.
        check_trained(msg.round, delta, None if dp_sgd else float(result.loss))
        if dp_sgd:
            # Only what the example-level guarantee covers leaves: no n, loss or steps.
            delta = delta.to(delta_device)
        else:
            reply = {
                F.NUM_EXAMPLES: result.num_examples,
                F.LOSS: result.loss,
                F.STEPS: result.steps,
            }
        clip = request_number(msg.config, F.CLIP_NORM, at_least=0.0, default=0.0, where=where)
        if clip > 0:
            # User-level DP: the update's L2 norm is bounded by C on the client, because
            # the server may only ever see the sum. The one clip of the update: encoders
            # downstream (Skellam) check the bound, they do not clip again.
            clipped = clip_update(delta, clip)
            if msg.config.get(F.CLIP_INDICATOR, False):
                reply[F.UNCLIPPED] = int(clipped.norm <= clip)
            if clipped.changed:
                delta = torch.from_numpy(clipped.vector).to(delta.device)
        if dp_sgd:
            return reply, delta
        weighting = msg.config.get(F.WEIGHTING, F.WEIGHT_BY_EXAMPLES)
        if weighting not in (F.WEIGHT_BY_EXAMPLES, F.WEIGHT_UNIFORM):
            raise MessageError(f"train message: weighting = {weighting!r}: examples or uniform")
        reply[F.WEIGHT] = 1.0 if weighting == F.WEIGHT_UNIFORM else float(result.num_examples)
        return reply, delta

    def _evaluate(self, client_id: int, msg: Envelope) -> Envelope:
        loss, acc, n = self._local_evaluation(client_id, msg)
        return Envelope(
            Kind.EVALUATE, msg.round, {F.LOSS: loss, F.ACCURACY: acc, F.NUM_EXAMPLES: n}
        )

    def _local_evaluation(self, client_id: int, msg: Envelope) -> tuple[float, float, int]:
        """(mean loss, accuracy, examples) of the request's model on the client's held-out
        data (its training data when it holds none apart)."""
        vector = self._global(msg)
        data = self.task.client_data(client_id)
        if data.x_eval is None or data.y_eval is None:
            x, y = data.x, data.y
        else:
            x, y = data.x_eval, data.y_eval
        return evaluate(self.model, vector, x, y, self.task.loss_fn)

    def _masked_input(self, client_id: int, msg: Envelope) -> tuple[dict[str, Any], torch.Tensor]:
        """What the masked-input stage masks: a training update, or, when the request asks
        for an evaluation (fields.INPUT), the client's bounded evaluation of its model."""
        if F.is_evaluation_input(msg.config):
            return self._evaluation_input(client_id, msg)
        if self.own_share is not None:
            # Counted here, once the session has accepted this request (a stale, replayed
            # or foreign one is refused before) and before any training: the run's
            # participation limit and the own-share cap (client/own_share.py).
            self.own_share.admit(client_id)
        return self._train_update(client_id, msg)

    def _evaluation_input(
        self, client_id: int, msg: Envelope
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """(accuracy, loss clipped to the request's cap and scaled) in [0, 1]^2 with weight 1,
        clamped here whatever the request says: one client moves the secure sum by a vector of
        L2 norm <= sqrt(3) (privacy/dp/evaluation.py). Nothing else leaves the client."""
        cap = request_number(msg.config, F.EVAL_LOSS_CAP, above=0.0, where="evaluation")
        loss, acc, n = self._local_evaluation(client_id, msg)
        if n == 0:
            raise MessageError("evaluation: this client holds no examples to evaluate on")
        try:
            vector = contribution(acc, loss, cap)
        except ValueError as exc:
            raise MessageError(f"evaluation: {exc}") from None
        # One vote per client, not per example; the loss travels in the vector, so the
        # encoding's own loss extra carries nothing.
        reply: dict[str, Any] = {F.WEIGHT: 1.0, F.LOSS: 0.0}
        return reply, torch.from_numpy(vector)
