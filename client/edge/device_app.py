"""The deployed client: what a device answers to a fedveil run, and the ClientApp around it.

`EdgeClient` turns one request Envelope into a reply for this device, with its
own data (or task) and its own policy. The device decides what code runs: it
never imports a module named by the server (a run whose task differs from the
device's own is refused), builds built-in models by registry name only, and
checks every request before training. Anything wrong with a request becomes
an error reply and a clear log line; nothing a server sends crashes a device.

`fedveil client` (edge.py) calls EdgeClient from its own long-lived worker, so
data and model are loaded once per process. `app` is the same logic as a
Flower ClientApp, for Flower's own subprocess isolation (node config keys:
client-id, data-path or task, and the policy keys of LocalPolicy with dashes).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp

from fedveil.builtin_models import MODELS, build_model
from fedveil.client.dpsgd_budget import DpSgdLedger
from fedveil.client.edge.edge_data import load_local_data, with_holdout
from fedveil.client.edge.edge_policy import LocalPolicy, planned_steps
from fedveil.client.edge.ledger_guard import LedgerGuard
from fedveil.client.flower_stock_server import is_stock_type
from fedveil.client.ftrl_participation import ParticipationGuard
from fedveil.client.masked_input_counts import MaskedInputCounts
from fedveil.client.runtime import ClientRuntime
from fedveil.client.sessions import Advance, RoundClock, SecAggSessions
from fedveil.client.trained_update import NonFiniteUpdate
from fedveil.config import ConfigError, RunConfig, config_from_dict
from fedveil.privacy.secagg import flower_run_id
from fedveil.privacy.secagg.identity_keys import ClientIdentity
from fedveil.protocol.deployment import CONFIG_KEY
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import is_evaluation_input
from fedveil.protocol.flower_codec import KINDS, from_content, message_type, to_content
from fedveil.protocol.kinds import ErrorCode, Kind, trains
from fedveil.protocol.piggyback import FAILED
from fedveil.tasks import ClientData, Task, load_task_function

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedveil.edge")

# The contract with the coordinator's FAB (its builder reads the same names) and the
# error codes of a device's replies: fedveil.protocol, defined once.
BAD_MESSAGE = ErrorCode.BAD_MESSAGE.value
DP_SGD_DIR = "dp_sgd"  # <state-dir>/dp_sgd/<run>.jsonl: the device's DP-SGD rounds
PARTICIPATION_DIR = "ftrl-participation"  # DP-FTRL: the device's own participations
MASKED_INPUTS_DIR = "masked-inputs"  # distributed DP: the masked inputs sent per run
CLIENT_FAILURE = ErrorCode.CLIENT_FAILURE.value


@dataclass(frozen=True)
class DataSource:
    """Local data files; the model is the run's built-in model (optionally pinned)."""

    data: ClientData
    model: str | None = None  # refuse runs of another built-in model


@dataclass(frozen=True)
class TaskSource:
    """A user task `module:function` installed on the device (data and model from it)."""

    ref: str


class EdgeClient:
    def __init__(
        self,
        source: DataSource | TaskSource,
        client_id: int,
        policy: LocalPolicy | None = None,
        device: str = "cpu",
        identity: ClientIdentity | None = None,
        ledger_guard: LedgerGuard | None = None,
        dp_sgd_ledger: DpSgdLedger | None = None,
        participation: ParticipationGuard | None = None,
        masked_inputs: MaskedInputCounts | None = None,
    ) -> None:
        """`identity`: this device's secure-aggregation identity key and the operator's
        roster; with one, the device takes part only in malicious-server sessions.
        `ledger_guard` checks every request's ledger head and refuses unwitnessed DP
        training (ledger_guard.py; default: one that keeps its pins in memory; the edge
        node gives it the state dir's store). `dp_sgd_ledger`: the device's own DP-SGD
        accounting across runs and restarts (the edge node keeps it in its state
        directory); required by a policy with max_dp_epsilon. `masked_inputs`: the masked
        inputs this device sent per run under distributed DP (the edge node keeps them in
        its state directory, so a restart does not reset the run's participation limit;
        default: in memory)."""
        if client_id < 0:
            raise ValueError(f"client id {client_id}: must be >= 0")
        if identity is not None and identity.client_id != client_id:
            raise ValueError(
                f"identity key of client {identity.client_id} given to client {client_id}"
            )
        self.source, self.client_id = source, client_id
        self.identity = identity
        self.policy = policy or LocalPolicy()
        self.device = device
        self.ledger_guard = ledger_guard if ledger_guard is not None else LedgerGuard()
        if self.policy.max_dp_epsilon and dp_sgd_ledger is None:
            raise ValueError(
                "max_dp_epsilon (--max-dp-epsilon) needs the device's DP-SGD ledger "
                "(kept in its state directory)"
            )
        self.dp_sgd_ledger = dp_sgd_ledger
        # DP-FTRL: this device's own participations per run (the edge node keeps them in
        # its state directory, so they survive a restart; client/ftrl_participation.py).
        self.participation = participation if participation is not None else ParticipationGuard()
        self.masked_inputs = masked_inputs if masked_inputs is not None else MaskedInputCounts()
        self._run_id: int | None = None
        self._run_cfg: RunConfig | None = None
        self._runtime: ClientRuntime | None = None
        self._num_examples = 0
        self._clock = RoundClock()
        self._state: dict[str, Any] = {}
        self.seconds_per_step: float | None = None

    # -- per run -------------------------------------------------------------
    def _run_config(self, run_config: Mapping[str, Any]) -> RunConfig:
        text = run_config.get(CONFIG_KEY)
        if not isinstance(text, str) or not text:
            raise MessageError(f"run config lacks {CONFIG_KEY!r}: not a fedveil run")
        try:
            return config_from_dict(tomllib.loads(text))
        except (tomllib.TOMLDecodeError, ConfigError) as exc:
            raise MessageError(f"the run's config is invalid: {exc}") from None

    def _task(self, cfg: RunConfig, request: Envelope) -> Task:
        if isinstance(self.source, TaskSource):
            if cfg.model.task != self.source.ref:
                raise MessageError(
                    f"this device runs task {self.source.ref!r}; the run wants "
                    f"{cfg.model.task or cfg.model.name!r}"
                )
            task = load_task_function(self.source.ref)(cfg)
            if not isinstance(task, Task):
                raise MessageError(f"task {self.source.ref!r} did not return a fedveil Task")
            return task
        data = self.source.data
        name = cfg.model.name
        if self.source.model is not None and name != self.source.model:
            raise MessageError(
                f"this device trains model {self.source.model!r}; the run wants {name!r}"
            )
        if name not in MODELS:
            raise MessageError(f"model {name!r} is not a built-in model on this device")
        num_classes = request.get("run_num_classes", int)
        shape = tuple(request.get("run_input_shape", list))
        if shape != tuple(data.x.shape[1:]):
            raise MessageError(
                f"the run's inputs have shape {shape}; this device's data has "
                f"{tuple(data.x.shape[1:])}"
            )
        if int(data.y.max()) >= num_classes:
            raise MessageError(
                f"this device's labels go up to {int(data.y.max())}; "
                f"the run has {num_classes} classes"
            )
        self._check_model_size(name, shape, num_classes)
        local = with_holdout(data, cfg.eval.client_holdout)
        build_model(name, shape, num_classes)  # fails here, with the model's own message
        return Task(
            name=f"local/{name}",
            input_shape=shape,
            num_classes=num_classes,
            num_clients=cfg.data.num_clients,
            model_fn=lambda: build_model(name, shape, num_classes),
            client_data=lambda cid: local,
        )

    def _check_model_size(self, name: str, shape: tuple[int, ...], num_classes: int) -> None:
        """Refuse, before a byte is allocated, a model larger than this device accepts:
        the request sets run_num_classes, the device's own limit bounds it."""
        limit = self.policy.max_model_parameters
        if not 1 <= num_classes <= limit:
            raise MessageError(
                f"run_num_classes = {num_classes}: this device accepts 1 to {limit} "
                "(max_model_parameters, --max-model-parameters)"
            )
        with torch.device("meta"):  # shapes only: nothing is allocated
            size = sum(p.numel() for p in build_model(name, shape, num_classes).parameters())
        if not size <= limit:
            raise MessageError(
                f"model {name!r} with {num_classes} classes has {size} parameters; this "
                f"device accepts at most {limit} (max_model_parameters, --max-model-parameters)"
            )

    def _runtime_for(
        self, run_id: int, run_config: Mapping[str, Any], request: Envelope
    ) -> ClientRuntime:
        if self._runtime is not None and self._run_id == run_id:
            return self._runtime
        cfg = self._run_config(run_config)
        try:
            task = self._task(cfg, request)
            identity = self.identity
            runtime = ClientRuntime(
                task,
                self.device,
                None if identity is None else (lambda _cid: identity),
                # Flower's run id, from this device's own context: sessions bind it.
                run_id=flower_run_id(run_id),
                # The run config this device accepted: distributed-DP parameters come
                # from it, never from a request.
                run_config=cfg,
                dp_sgd_budget=None
                if self.dp_sgd_ledger is None
                else self.dp_sgd_ledger.for_run(str(run_id)),
                max_own_share_epsilon=self.policy.max_own_share_epsilon or None,
                participation=self.participation,
                masked_inputs=self.masked_inputs.for_run(str(run_id)),
            )
            self._num_examples = len(task.client_data(self.client_id))
        except MessageError:
            raise
        except Exception as exc:  # the device's task or data cannot serve this run
            raise MessageError(f"cannot set up this run: {type(exc).__name__}: {exc}") from None
        self._runtime, self._run_id, self._run_cfg = runtime, run_id, cfg
        self._clock, self._state = RoundClock(), {}
        log.info(
            "run %d: %s, %d parameters, %d local examples",
            run_id,
            task.name,
            runtime.model.size,
            self._num_examples,
        )
        if cfg.dp.mechanism == "distributed":
            try:
                runtime.pinned_plan()
            except MessageError as exc:  # each masked input is refused with this reason
                log.warning("run %d: %s", run_id, exc)
            else:
                log.info("run %d: %s", run_id, own_share_plan_line(runtime, cfg))
        return runtime

    # -- per message ---------------------------------------------------------
    def handle(self, run_id: int, run_config: Mapping[str, Any], request: Envelope) -> Envelope:
        runtime = self._runtime_for(run_id, run_config, request)
        step = self._clock.advance(request.round)
        if step is Advance.NEW_RUN:
            self._state = {}  # the coordinator started over
        elif step is Advance.NEW_ROUND:
            SecAggSessions(self._state).retire(request.round)
        training = trains(request.kind, request.config)
        if training and self.policy.max_train_seconds and self.seconds_per_step is None:
            self.seconds_per_step = self._probe_step(runtime)
        request, capped = self.policy.apply(request, self._num_examples, self.seconds_per_step)
        assert self._run_cfg is not None
        # Before it trains: a DP request shows a head this device can verify and keep.
        self.ledger_guard.check(run_id, self._run_cfg, request)
        start = time.perf_counter()
        reply = runtime.handle(self.client_id, request, self._state)
        if FAILED in reply.config:  # the primary of a request with a rider failed
            log.warning(
                "run %d round %d: %s failed: %s",
                run_id,
                request.round,
                request.kind,
                reply.config[FAILED],
            )
        elif request.kind == Kind.SECAGG_MASKED_INPUT and is_evaluation_input(request.config):
            log.info(
                "run %d round %d: evaluated the model on this device's held-out data; the "
                "result leaves masked",
                run_id,
                request.round,
            )
        elif training:
            if request.kind == Kind.SECAGG_MASKED_INPUT and runtime.own_share is not None:
                account = runtime.own_share
                done = account.participations(self.client_id)
                log.info(
                    "run %d round %d: own-share-only epsilon against the coordinator after "
                    "%d participations: %.4g (stated, at the plan's %d honest shares: %.4g)",
                    run_id,
                    request.round,
                    done,
                    account.epsilon(done),
                    account.plan.min_honest,
                    account.stated_epsilon(done),
                )
            elapsed = time.perf_counter() - start
            steps = planned_steps(request, self._num_examples)
            if steps:
                self.seconds_per_step = elapsed / steps
            if capped:
                reply.config["capped"] = True
            log.info(
                "run %d round %d: trained %s steps on %d examples in %.2f s%s%s",
                run_id,
                request.round,
                steps,
                self._num_examples,
                elapsed,
                "; the update leaves masked" if request.kind != Kind.TRAIN else "",
                " (capped by local policy)" if capped else "",
            )
        return reply

    def _probe_step(self, runtime: ClientRuntime) -> float:
        """Seconds for one forward/backward pass on one batch (no update kept)."""
        data = runtime.task.client_data(self.client_id)
        xb, yb = data.x[:32].to(runtime.model.device), data.y[:32].to(runtime.model.device)
        module = runtime.model.module
        module.train()
        start = time.perf_counter()
        loss = runtime.task.loss_fn(module(xb), yb)
        loss.backward()
        module.zero_grad(set_to_none=True)
        return max(time.perf_counter() - start, 1e-6)


def own_share_plan_line(runtime: ClientRuntime, cfg: RunConfig) -> str:
    """The device's own-share-only figures for a distributed-DP run (client/own_share.py)."""
    account = runtime.own_share
    assert account is not None
    plan = account.plan
    rounds = cfg.server.rounds
    cap = account.cap
    return (
        f"distributed DP: the plan states z = {plan.noise_multiplier:.4g} per release at "
        f"{plan.min_honest} honest noise shares (secagg.adversarial_rate = "
        f"{cfg.secagg.adversarial_rate:g}); this device's own share alone is z = "
        f"{account.own_z:.4g}. Against the coordinator, taking part in {rounds} rounds: "
        f"{account.stated_epsilon(rounds):.4g} as stated, {account.epsilon(rounds):.4g} "
        "own-share-only (every other cohort member the coordinator's); "
        + (f"cap {cap:g} (--max-own-share-epsilon)" if cap else "no cap set")
    )


def answer(
    edge: EdgeClient, msg: Message, context_run_id: int, run_config: Mapping[str, Any]
) -> Message:
    """The reply Message to a request Message: a result or an error, never an exception."""
    if is_stock_type(msg.metadata.message_type):  # Flower's conventions, no fedveil envelope
        reason = edge.policy.stock_refusal(msg.metadata.message_type)
        log.warning("run %d: %s", context_run_id, reason)
        return Message(Error(BAD_MESSAGE, reason), reply_to=msg)
    try:
        request = from_content(msg.content)
    except Exception as exc:
        log.warning("run %d: bad message from the server dropped: %s", context_run_id, exc)
        return Message(Error(BAD_MESSAGE, f"bad message: {exc}"), reply_to=msg)
    try:
        reply = edge.handle(context_run_id, run_config, request)
    except MessageError as exc:
        log.warning(
            "run %d round %d: %s request refused: %s",
            context_run_id,
            request.round,
            request.kind,
            exc,
        )
        return Message(Error(BAD_MESSAGE, str(exc)), reply_to=msg)
    except NonFiniteUpdate as exc:  # the device's data or model diverged: no traceback
        log.warning("run %d: %s request failed: %s", context_run_id, request.kind, exc)
        return Message(Error(CLIENT_FAILURE, str(exc)), reply_to=msg)
    except ValueError as exc:  # e.g. a diverged model's NaN update, refused: one line
        log.warning(  # as the same failure under a rider logs it (EdgeClient.handle)
            "run %d round %d: %s failed: %s: %s",
            context_run_id,
            request.round,
            request.kind,
            type(exc).__name__,
            exc,
        )
        return Message(Error(CLIENT_FAILURE, f"{type(exc).__name__}: {exc}"), reply_to=msg)
    except Exception as exc:  # a fault of this device's code: its traceback
        log.exception("run %d round %d: %s failed", context_run_id, request.round, request.kind)
        return Message(Error(CLIENT_FAILURE, f"{type(exc).__name__}: {exc}"), reply_to=msg)
    return Message(to_content(reply), reply_to=msg)


# -- Flower ClientApp (for Flower's own process isolation) ---------------------
def edge_from_node_config(node_config: Mapping[str, Any]) -> EdgeClient:
    """An EdgeClient from a SuperNode's --node-config (see module doc)."""
    try:
        cid = int(node_config["client-id"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("node config needs an integer 'client-id'") from None
    if "task" in node_config and ":" in str(node_config["task"]):
        source: DataSource | TaskSource = TaskSource(str(node_config["task"]))
    elif "data-path" in node_config:
        model = node_config.get("task")
        source = DataSource(
            load_local_data(str(node_config["data-path"])), str(model) if model else None
        )
    else:
        raise ValueError("node config needs 'data-path' or 'task' (module:function)")
    policy = LocalPolicy(
        require_secagg=bool(node_config.get("require-secagg", False)),
        max_clip_norm=float(node_config.get("max-clip-norm", 0.0)),
        min_dp_noise=float(node_config.get("min-dp-noise", 0.0)),
        max_local_epochs=int(node_config.get("max-local-epochs", 0)),
        max_local_steps=int(node_config.get("max-local-steps", 0)),
        max_train_seconds=float(node_config.get("max-train-seconds", 0.0)),
        allow_apps=tuple(str(node_config.get("allow-apps", "")).split()),
        max_dp_epsilon=float(node_config.get("max-dp-epsilon", 0.0)),
        max_model_parameters=int(
            node_config.get("max-model-parameters", LocalPolicy.max_model_parameters)
        ),
        max_own_share_epsilon=float(node_config.get("max-own-share-epsilon", 0.0)),
    )
    state = node_config.get("state-dir")
    ledger = (
        None
        if state is None
        else DpSgdLedger(Path(str(state)) / DP_SGD_DIR, policy.max_dp_epsilon, policy.dp_delta)
    )
    # The masked inputs sent per run survive a restart of the app's process too.
    counts = None if state is None else MaskedInputCounts(Path(str(state)) / MASKED_INPUTS_DIR)
    # So do its DP-FTRL participations (the edge node's own path does the same).
    guard = None if state is None else ParticipationGuard(Path(str(state)) / PARTICIPATION_DIR)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return EdgeClient(
        source,
        cid,
        policy,
        device,
        dp_sgd_ledger=ledger,
        participation=guard,
        masked_inputs=counts,
    )


app = ClientApp()
_edges: dict[str, EdgeClient] = {}


def _handle(msg: Message, context: Context) -> Message:
    if "edge" not in _edges:
        _edges["edge"] = edge_from_node_config(context.node_config)
    return answer(_edges["edge"], msg, context.run_id, context.run_config)


for _kind in KINDS:
    _category, _action = message_type(_kind).split(".")
    getattr(app, _category)(_action)(_handle)
