"""What a client holding a distributed-DP plan answers, whatever a request says.

The plan (privacy/dp/plan.py) comes from the client's own run config: in simulation
the run's own, on a device the run config it accepted (client/edge). The epsilon
stated against the coordinator holds only if every masked sum carries this client's
Skellam noise share with the plan's parameters, so a client holding a plan:

- trains only as a secure-aggregation masked input that names the plan's encoding
  (`skellam`), the plan's noise parameters, the plan's clip (`clip_norm` = dp.clip_norm)
  and uniform weighting (`examples` weighting would reveal the sum of example counts);
  a masked input naming `quantized` would hand the coordinator the cohort's un-noised
  sum and mean loss; a plain `train` would hand it this client's update in the clear;
- evaluates never: a plain `evaluate` is its accuracy, loss and example count in the
  clear, and a masked-input evaluation (`input = "evaluation"`) has no accounted
  mechanism under distributed DP (the drift evaluations of privacy/dp/evaluation.py are
  accounted for central-DP and DP-SGD versions only).

Under secure aggregation alone (`secagg.enabled`, any or no DP mechanism) a client
trains only as a masked input too: a plain `train` would hand the coordinator its update
in the clear, which is what the run's secure aggregation exists to prevent
(`refuse_unmasked_training`).

Whatever passes leaves as the Skellam encoding's vector alone: that encoding carries no
loss, weight or example count (privacy/encodings.py), so nothing computed from this
client's data leaves outside the noised vector. Each refusal is a MessageError naming
the field, what the request asked and what the plan says; it comes before any training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedveil.client.secagg_stages import check_skellam_params
from fedveil.privacy.encodings import SkellamEncoding
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.kinds import Kind

if TYPE_CHECKING:
    from fedveil.privacy.dp.distributed_plan import DistributedDpPlan

_MISSING = "(missing)"


class PlanRefusal(MessageError):
    """A request that is not the distributed-DP plan this client holds."""


def refuse_unmasked_training(msg: Envelope) -> None:
    """Under `secagg.enabled` in the client's own run config: refuse a plain `train`."""
    if msg.kind == Kind.TRAIN:
        raise PlanRefusal(
            "this client's run has secagg.enabled = true (in the run config it accepted): "
            "a plain train request would hand the coordinator its update in the clear; it "
            "trains only as a secure-aggregation masked input, so it is refused"
        )


def refuse_in_the_clear(msg: Envelope) -> None:
    """Under distributed DP: refuse a plain `train` or `evaluate` (needs no plan: whatever
    the plan, these replies leave in the clear)."""
    if msg.kind == Kind.TRAIN:
        raise PlanRefusal(
            "this client's run has dp.mechanism = 'distributed' (in the run config it "
            "accepted): a plain train request would hand the coordinator its update in "
            "the clear, without its noise share; it trains only as a secure-aggregation "
            f"masked input with the {SkellamEncoding.NAME!r} encoding, so it is refused"
        )
    if msg.kind == Kind.EVALUATE:
        raise PlanRefusal(
            "this client's run has dp.mechanism = 'distributed' (in the run config it "
            "accepted): a plain evaluate request would hand the coordinator its "
            "held-out accuracy, loss and example count in the clear, outside the "
            "epsilon stated against the coordinator, so it is refused"
        )


@dataclass(frozen=True)
class PinnedPlan:
    """The distributed-DP plan a client holds for its run, and the check of each request."""

    plan: DistributedDpPlan
    clip_norm: float  # the run config's dp.clip_norm
    weighting: str = F.WEIGHT_UNIFORM

    def check_masked_input(self, msg: Envelope) -> None:
        """Refuse a masked-input request that is not the plan (see the module doc)."""
        config = msg.config
        asked = config.get(F.INPUT, F.INPUT_UPDATE)
        if asked != F.INPUT_UPDATE:
            raise PlanRefusal(
                f"{msg.kind}: {F.INPUT} = {asked!r} in the request; this client's "
                f"distributed-DP plan masks only training updates ({F.INPUT} = "
                f"{F.INPUT_UPDATE!r}): no evaluation under distributed DP has an accounted "
                "mechanism, so its accuracy and loss would leave outside the stated epsilon"
            )
        encoding = config.get(F.ENC_KIND, _MISSING)
        if encoding != SkellamEncoding.NAME:
            raise PlanRefusal(
                f"{msg.kind}: {F.ENC_KIND} = {encoding!r} in the request; this client's "
                f"distributed-DP plan says {SkellamEncoding.NAME!r} (its own noise share on "
                "every update): another encoding would give the coordinator the sum without "
                "noise"
            )
        check_skellam_params(SkellamEncoding.requested_params(msg), self.plan.params)
        clip = config.get(F.CLIP_NORM, _MISSING)
        # Exactly dp.clip_norm: both sides read it from the same config text (a NaN is unequal).
        same_clip = (
            isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip == self.clip_norm
        )
        if not same_clip:
            raise PlanRefusal(
                f"{msg.kind}: {F.CLIP_NORM} = {clip!r} in the request; this client's "
                f"distributed-DP plan says {self.clip_norm!r} (dp.clip): its noise share is "
                "sized for updates clipped to that norm"
            )
        weighting = config.get(F.WEIGHTING, _MISSING)
        if weighting != self.weighting:
            raise PlanRefusal(
                f"{msg.kind}: {F.WEIGHTING} = {weighting!r} in the request; this client's "
                f"distributed-DP plan says {self.weighting!r} (example weighting would "
                "reveal the sum of the cohort's example counts)"
            )
