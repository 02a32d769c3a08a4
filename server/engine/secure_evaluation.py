"""A federated evaluation released under DP: secure aggregation, a charge, then noise.

Used for the drift evaluation of a model version trained with DP (server/coordinator/
drift_run.py); the mechanism and its sensitivity are in privacy/dp/evaluation.py.

 1 requests  each chosen device gets the model in its masked-input request, with
             fields.INPUT = evaluation and the plan's loss cap; it evaluates on its own
             held-out data and masks (accuracy, capped loss / cap), weight 1 (client/runtime.py)
 2 collect   SecAggChannel, quantized over [-1, 1] with max weight 1 (the run's threat
             mode and roster): the server holds masked vectors, then only their sum
 3 charge    EvaluationCharge, the channel's UnmaskGate, before the first unmasking request:
             the version's evaluations composed with this one must stay within its budget,
             and the release's signed ledger entry is written and fsync'ed; else the session
             aborts with nothing unmasked
 4 release   Gaussian noise (OS CSPRNG) on (count, sum of accuracies, sum of scaled losses),
             then the clamped means; the exact sums, who answered and why others dropped go
             to the operator's private record only

An abort before unmasking reveals nothing and is charged nothing; one after unmasking stays
charged (the sum was reconstructed) and releases nothing. The ledger always ends with its
signed final record, so `fedveil privacy verify` passes on the run either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedveil.config import SecAggSection
from fedveil.privacy.dp import BudgetExceededError, Ledger, PrivacyBudget, PrivacyEvent
from fedveil.privacy.dp.evaluation import (
    CONTRIBUTION_SIZE,
    RELEASE_KIND,
    SENSITIVITY,
    EvaluationPlan,
    composed_epsilon,
)
from fedveil.privacy.dp.ledger import FINAL
from fedveil.privacy.encodings import QuantizedEncoding
from fedveil.privacy.secagg import SecAggAborted
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.secagg_channel import SecAggChannel
from fedveil.server.engine.transport import Transport

log = logging.getLogger("fedveil.privacy")

ROUND = 1  # one evaluation: one secure-aggregation session, ledger release 1
STATEMENT = (
    "Released under DP: the mean accuracy and loss of the devices asked, each device one "
    "vote (accuracy and capped loss in [0, 1]), computed from Gaussian-noised sums of the "
    "securely aggregated values and clamped to range; the devices were not sampled, so no "
    "amplification is claimed. How many devices answered and their exact results are "
    "withheld (the operator's private annex)."
)
CLIP_RANGE = 1.0  # every contribution coordinate lies in [0, 1]


@dataclass(frozen=True)
class EvaluationResult:
    """`public`: what may be published (the run's summary, the drift state); `private`: the
    operator's annex (exact sums, who answered, drop reasons)."""

    public: dict[str, Any]
    private: dict[str, Any]


class EvaluationCharge:
    """The UnmaskGate of one DP evaluation: refuse past the budget, else ledger it, and only
    then let the channel unmask. `prior`: the evaluations of the same version already
    charged; `budget`: the most their composition with this one may reach."""

    def __init__(
        self,
        plan: EvaluationPlan,
        ledger: Ledger,
        *,
        prior: Sequence[PrivacyEvent],
        budget: float,
        extra: Mapping[str, Any],
    ) -> None:
        self.plan, self.ledger, self.prior, self.budget = plan, ledger, list(prior), budget
        self.extra = dict(extra)
        self.entry: dict[str, Any] | None = None
        self.composed: float | None = None

    def before_unmask(self, round_num: int, survivors: frozenset[int]) -> None:
        composed = composed_epsilon([*self.prior, self.plan.event()], self.plan.delta)
        if composed > self.budget:
            raise SecAggAborted(
                f"the version's drift evaluations would reach epsilon {composed:.4g} > budget "
                f"{self.budget:g}; nothing unmasked"
            )
        fields = {"release": RELEASE_KIND, "training_round": 0, **self.extra}
        try:
            self.entry = PrivacyBudget(self.plan.dp_config()).record_release(
                self.ledger,
                round_number=self.ledger.last_round + 1,
                event=self.plan.event(),
                clip_norm=SENSITIVITY,
                extra=fields,
            )
        except BudgetExceededError as exc:  # a plan whose z does not meet its epsilon
            raise SecAggAborted(f"{exc}; nothing unmasked") from None
        self.composed = composed


def evaluation_channel(
    settings: SecAggSection,
    gate: EvaluationCharge,
    roster: Mapping[int, bytes] | None,
    run_id: bytes,
) -> SecAggChannel:
    """The run's secure aggregation (its threat mode and parameters) over the evaluation's
    encoding: coordinates in [-1, 1], one unit of weight per device."""
    encoding = QuantizedEncoding(CLIP_RANGE, settings.levels, max_weight=1)
    return SecAggChannel(settings, encoding, roster, run_id, gate=gate, quiet_counts=True)


def evaluation_request(weights: torch.Tensor, plan: EvaluationPlan) -> Envelope:
    """What rides on a device's masked-input request: the model and what to evaluate."""
    config: dict[str, Any] = {F.INPUT: F.INPUT_EVALUATION, F.EVAL_LOSS_CAP: plan.loss_cap}
    return Envelope(Kind.SECAGG_MASKED_INPUT, ROUND, config, {F.MODEL: weights})


def evaluate_securely(
    transport: Transport,
    cohort: Sequence[int],
    weights: torch.Tensor,
    plan: EvaluationPlan,
    settings: SecAggSection,
    ledger: Ledger,
    *,
    prior: Sequence[PrivacyEvent],
    budget: float,
    roster: Mapping[int, bytes] | None = None,
    run_id: bytes,
    timeout_s: float | None = None,
    ledger_extra: Mapping[str, Any] | None = None,
) -> EvaluationResult:
    """Evaluate `weights` on `cohort`'s held-out data under secure aggregation and release
    the noised means, charged to `ledger` first. The ledger must be new: one evaluation
    releases once (a retried attempt is refused rather than charged twice)."""
    if len(ledger):
        raise RuntimeError(
            f"{ledger.path}: this evaluation already has ledger entries; it releases once"
        )
    gate = EvaluationCharge(plan, ledger, prior=prior, budget=budget, extra=ledger_extra or {})
    channel = evaluation_channel(settings, gate, roster, run_id)
    request = evaluation_request(weights.detach().cpu(), plan)
    requests = {cid: request for cid in sorted(cohort)}
    try:
        outcome = channel.collect(transport, requests, CONTRIBUTION_SIZE, timeout_s)
        if isinstance(outcome, Aggregate):
            return _released(plan, gate, len(requests), outcome)
        log.warning(
            "drift evaluation aborted %s; nothing released (reason in the private annex)",
            "after unmasking: charged" if outcome.unmasked else "before unmasking: not charged",
        )
        return EvaluationResult(
            _figures(plan, gate) | {"released": False, "aborted": outcome.stage},
            {"clients_asked": len(requests), "aborted": outcome.reason}
            | {"dropped": {str(c): r for c, r in sorted(outcome.dropped.items())}},
        )
    finally:
        if not ledger.closed:
            epsilon = gate.entry["epsilon"] if gate.entry is not None else 0.0
            ledger.close(FINAL, {"training_round": 0, "epsilon": epsilon})


def _released(
    plan: EvaluationPlan, gate: EvaluationCharge, asked: int, agg: Aggregate
) -> EvaluationResult:
    if gate.entry is None:  # the channel unmasks only through the gate
        raise RuntimeError("secure aggregation unmasked without charging the ledger")
    count = float(agg.weight)  # one unit per device that survived
    accuracy_sum, loss_sum = (float(v) for v in agg.total[:CONTRIBUTION_SIZE])
    noised = plan.release(count, accuracy_sum, loss_sum)
    public = _figures(plan, gate) | {
        "released": True,
        "federated_accuracy": noised.accuracy,
        "federated_loss": noised.loss,
    }
    private = {
        "clients_asked": asked,
        "clients_answered": len(agg.contributors),
        "survivors": list(agg.contributors),
        "dropped": {str(c): r for c, r in sorted(agg.dropped.items())},
        # The curator's view before the noise: the exact sums (never published).
        "sums": {"count": count, "accuracy": accuracy_sum, "scaled_loss": loss_sum},
        "exact_accuracy": accuracy_sum / count if count else None,
        "exact_loss": loss_sum / count * plan.loss_cap if count else None,
    }
    log.info(
        "drift evaluation released: accuracy %.4f (noised), epsilon %.4g",
        noised.accuracy,
        public["epsilon"],
    )
    return EvaluationResult(public, private)


def _figures(plan: EvaluationPlan, gate: EvaluationCharge) -> dict[str, Any]:
    """The evaluation's accounted, public figures (epsilon 0 when nothing was charged)."""
    entry = gate.entry
    return {
        "epsilon": entry["epsilon"] if entry is not None else 0.0,
        "epsilon_composed": gate.composed,
        "budget": gate.budget,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "noise_std": plan.noise_std,
        "sensitivity": SENSITIVITY,
        "loss_cap": plan.loss_cap,
        "accountant": plan.dp_config().accountant_name,
        "mechanism": "central Gaussian on the securely aggregated sum (user-level, add/remove)",
        "statement": STATEMENT,
    }
