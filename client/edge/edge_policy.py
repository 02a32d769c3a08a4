"""What a device will do, whatever the server asks: set on the device, never by the server.

Training is asked for by a `train` message (the update goes back in the
clear) or by the masked-input stage of secure aggregation,
`secagg.masked_input` (the update only ever leaves this device masked).
Either is checked, and capped, before any training:
- require_secagg: refuse `train`; train only under secure aggregation. It refuses a
  plain `evaluate` too: that reply hands the server this device's held-out accuracy,
  loss and example count in the clear; such a device evaluates only as a
  secure-aggregation masked input (`input = "evaluation"`, below).
- max_clip_norm: refuse to send an update that is not clipped to L2 norm
  <= this bound (`clip_norm` in the request, as DP rounds ask), so this
  device's influence on any release is bounded whatever the server does.
- min_dp_noise: refuse rounds whose local DP-SGD noise multiplier
  (`dp_sgd_noise`, from the run's client.dp_sgd_noise) is below this level, or is not a
  finite number (NaN, infinity, missing, a string: fedveil.protocol.numbers, whose
  checks a non-number fails).
- max_dp_epsilon: the device's own cap on its example-level DP-SGD epsilon, composed
  over every round it trained (client/dpsgd_budget.py, at delta dp_delta): a training
  request without DP-SGD noise (its epsilon is unbounded) is refused here, and a DP-SGD
  round that would take the device past the cap is refused before training.
- max_own_share_epsilon: under distributed DP, refuse a masked input that would bring
  this device's own-share-only epsilon against the coordinator (its own Skellam share
  alone: the figure if every other cohort member is the coordinator's) above this cap
  (client/own_share.py; 0: no cap, the figure is still logged).
- max_local_epochs / max_local_steps: cap the work of one round.
- max_train_seconds: cap one round's local training time; steps are capped
  from the measured time per step (a probe step before the first round).
- max_model_parameters: the largest model this device builds for a run of a built-in
  model (its parameters counted before any memory is allocated; the run's
  `run_num_classes` must also cover this device's labels); a request asking more is
  refused. `fedveil client --max-model-parameters`.
- allow_apps: the Flower apps (FAB ids, `publisher/name`) whose runs this device
  takes part in besides the coordinator's own (fedveil/fedveil-service, always
  allowed); `fedveil client --allow-app NAME`. Whatever the app, the device runs
  its own installed ClientApp, never code the app brings, so the app must name it.
A stock Flower `train` message (Flower's Message-API conventions, no fedveil
protocol) would take the update in the clear: refused under require_secagg.
A masked-input stage that asks for an evaluation (a DP drift evaluation) trains
nothing: the device sends its own accuracy and capped loss, each clamped to
[0, 1] with weight 1, so none of the training checks apply to it.
Under distributed DP (the run config the device accepted says dp.mechanism =
'distributed') every client refuses, whatever its flags, a plain `train` or `evaluate`
and any masked input that is not the plan it computed from that config (encoding, noise
parameters, clip, weighting, kind: client/plan_pin.py): the epsilon stated against the
coordinator assumes it sees only sums carrying the plan's noise shares.
A rider (the next round's key stage riding on this round's message, protocol/piggyback.py)
may only be a key, consistency or unmasking stage: nothing that computes on this
device's data rides past the checks of `apply`, which see the request's own kind.
A refusal is a MessageError: the device answers with an error, the server
drops it from that round, and the device stays connected for the next one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fedveil.client.dpsgd_budget import DEFAULT_DELTA
from fedveil.protocol.deployment import CLIENTAPP_REF, FAB_ID
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.fields import BATCH_SIZE, CLIP_NORM, DP_SGD_NOISE, LOCAL_EPOCHS, LOCAL_STEPS
from fedveil.protocol.kinds import MESSAGE_KINDS, Kind, trains
from fedveil.protocol.numbers import request_int, request_number
from fedveil.protocol.piggyback import detach


class PolicyRefusal(MessageError):
    """The request is against this device's local policy."""


@dataclass(frozen=True)
class LocalPolicy:
    require_secagg: bool = False
    max_clip_norm: float = 0.0  # 0: no requirement
    min_dp_noise: float = 0.0
    max_dp_epsilon: float = 0.0  # 0: no cap (still accounted)
    dp_delta: float = DEFAULT_DELTA
    max_local_epochs: int = 0  # 0: no cap
    max_local_steps: int = 0
    max_train_seconds: float = 0.0
    allow_apps: tuple[str, ...] = ()  # FAB ids allowed besides FAB_ID
    max_model_parameters: int = 20_000_000  # a run's built-in model, counted before it is built
    max_own_share_epsilon: float = 0.0  # 0: no cap (client/own_share.py)

    def __post_init__(self) -> None:
        for app in self.allow_apps:
            if not _is_fab_id(app):
                raise ValueError(
                    f"allow_apps (--allow-app): {app!r} is not a Flower app id; expected "
                    "'publisher/name' (as in [tool.flwr.app] publisher and [project] name)"
                )
        if not (0 < self.dp_delta < 1):
            raise ValueError(f"dp_delta = {self.dp_delta!r}: must be in (0, 1)")
        caps = ("min_dp_noise", "max_train_seconds", "max_clip_norm", "max_dp_epsilon")
        for name in (*caps, "max_own_share_epsilon"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} = {v!r}: must be a finite number >= 0")
        for name in ("max_local_epochs", "max_local_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 0")
        if not 1 <= self.max_model_parameters <= 10**10:
            raise ValueError(
                f"max_model_parameters = {self.max_model_parameters}: must be in [1, 1e10]"
            )

    def describe(self) -> str:
        parts = []
        if self.require_secagg:
            parts.append("secure aggregation required")
        if self.max_clip_norm:
            parts.append(f"updates clipped to <= {self.max_clip_norm:g}")
        if self.min_dp_noise:
            parts.append(f"DP-SGD noise >= {self.min_dp_noise}")
        if self.max_dp_epsilon:
            parts.append(f"DP-SGD epsilon <= {self.max_dp_epsilon:g} at delta {self.dp_delta:g}")
        if self.max_local_epochs:
            parts.append(f"<= {self.max_local_epochs} local epochs")
        if self.max_local_steps:
            parts.append(f"<= {self.max_local_steps} local steps")
        if self.max_train_seconds:
            parts.append(f"<= {self.max_train_seconds:g} s of training")
        if self.max_own_share_epsilon:
            parts.append(f"own-share-only epsilon <= {self.max_own_share_epsilon:g}")
        if self.allow_apps:
            parts.append(f"also runs apps {', '.join(self.allow_apps)}")
        return ", ".join(parts) or "none"

    def app_refusal(self, fab_id: str, clientapp: object) -> str | None:
        """Why this device does not take part in a run of the app `fab_id` whose FAB names
        `clientapp` (None: it does)."""
        allowed = (FAB_ID, *self.allow_apps)
        if fab_id not in allowed:
            return (
                f"local policy: this device runs only the apps {', '.join(allowed)}; the run "
                f"is of app {fab_id!r}. Start the device with --allow-app {fab_id} to take "
                "part in its runs"
            )
        if clientapp != CLIENTAPP_REF:
            return (
                f"app {fab_id!r} names ClientApp {clientapp!r}; this device runs only its "
                f"own installed ClientApp ({CLIENTAPP_REF}), never code an app brings"
            )
        return None

    def stock_refusal(self, message_type: str) -> str:
        """The reply to a stock Flower `train`/`evaluate` message (no fedveil protocol)."""
        if self.require_secagg and message_type == Kind.TRAIN.value:
            return (
                "local policy: this device requires secure aggregation (--require-secagg); "
                "a stock Flower train message would take its update in the clear"
            )
        if self.require_secagg and message_type == Kind.EVALUATE.value:
            return (
                "local policy: this device requires secure aggregation (--require-secagg); "
                "a stock Flower evaluate message would take its accuracy and loss in the clear"
            )
        return (
            f"this device answers fedveil's protocol only, not a stock Flower "
            f"{message_type!r} message"
        )

    def apply(
        self, request: Envelope, num_examples: int, seconds_per_step: float | None
    ) -> tuple[Envelope, bool]:
        """The request as this device will run it, and whether it was capped."""
        self._check_rider(request)
        if self.require_secagg and request.kind == Kind.EVALUATE:
            raise PolicyRefusal(
                "local policy: this device requires secure aggregation (--require-secagg); "
                "the server asked for its held-out accuracy and loss in the clear (a plain "
                "evaluate request). It evaluates only as a secure-aggregation masked input"
            )
        if not trains(request.kind, request.config):
            # An evaluation's masked input is bounded by this device itself (accuracy and
            # capped loss in [0, 1], weight 1: client/runtime.py), whatever the server asks.
            return request, False
        config = dict(request.config)
        if self.require_secagg and request.kind == Kind.TRAIN:
            raise PolicyRefusal(
                "local policy: this device requires secure aggregation; "
                "the server asked for an update in the clear"
            )
        if self.max_clip_norm > 0:
            _policy_number(
                config,
                CLIP_NORM,
                "this device sends only updates clipped to an L2 norm in "
                f"(0, {self.max_clip_norm:g}] (--max-clip-norm)",
                above=0.0,
                at_most=self.max_clip_norm,
            )
        if self.min_dp_noise > 0:
            # A NaN, an infinity, a string or a missing field fails this check too.
            _policy_number(
                config,
                DP_SGD_NOISE,
                "this device trains only with local DP-SGD noise "
                f"multiplier >= {self.min_dp_noise:g} (--min-dp-noise)",
                at_least=self.min_dp_noise,
            )
        self._check_dp_sgd_on(config)
        steps = planned_steps(request, num_examples)
        if steps is None:
            return request, False  # malformed: the runtime rejects it with the field name
        cap = steps
        per_epoch = max(1, -(-num_examples // max(1, int(config[BATCH_SIZE]))))
        if self.max_local_epochs:
            cap = min(cap, self.max_local_epochs * per_epoch)
        if self.max_local_steps:
            cap = min(cap, self.max_local_steps)
        if self.max_train_seconds and seconds_per_step:
            cap = min(cap, max(1, int(self.max_train_seconds / seconds_per_step)))
        if cap >= steps:
            return request, False
        config[LOCAL_STEPS] = int(cap)
        return Envelope(request.kind, request.round, config, request.arrays), True

    def _check_dp_sgd_on(self, config: dict[str, object]) -> None:
        # Under a cap, training without DP-SGD noise has no bounded epsilon: refused
        # (written so that a missing, non-numeric or NaN noise fails it).
        if not self.max_dp_epsilon:
            return
        noise = config.get(DP_SGD_NOISE)
        number = isinstance(noise, (int, float)) and not isinstance(noise, bool)
        if not (number and math.isfinite(noise) and noise > 0):  # type: ignore[arg-type]
            raise PolicyRefusal(
                f"local policy: this device trains only with DP-SGD under its cap "
                f"--max-dp-epsilon {self.max_dp_epsilon:g}; the request has "
                f"{DP_SGD_NOISE} = {noise!r}, whose example-level epsilon is unbounded"
            )

    @staticmethod
    def _check_rider(request: Envelope) -> None:
        # apply's checks see the request's own kind only: a rider that trains or
        # evaluates would answer past them (the server sends key-stage riders only).
        _, rider = detach(request)
        if rider is not None and rider.kind not in MESSAGE_KINDS:
            raise PolicyRefusal(
                f"local policy: a {request.kind} request carries a {rider.kind!r} rider; a "
                "rider may only be a secure-aggregation key, consistency or unmasking "
                "stage, and this device answers anything that computes on its data only as "
                "a request of its own, where its policy checks it"
            )


def _policy_number(config: Mapping[str, object], field: str, rule: str, **limits: float) -> float:
    """A request number checked against this device's limit (fedveil.protocol.numbers), or
    a PolicyRefusal naming the field, the value, the limit and the rule."""
    try:
        return request_number(config, field, where="local policy", **limits)
    except MessageError as exc:
        raise PolicyRefusal(f"{exc}: {rule}") from None


def _is_fab_id(app: str) -> bool:
    publisher, slash, name = app.partition("/")
    return bool(slash and publisher and name and "/" not in name and app.strip() == app)


def planned_steps(request: Envelope, num_examples: int) -> int | None:
    """The local steps a training request asks for (None if its fields are malformed)."""
    config = request.config
    try:
        steps, epochs = (request_int(config, k, at_least=0) for k in (LOCAL_STEPS, LOCAL_EPOCHS))
        batch = request_int(config, BATCH_SIZE, at_least=1)
    except MessageError:
        return None
    if steps > 0:
        return steps
    return epochs * max(1, -(-num_examples // batch))
