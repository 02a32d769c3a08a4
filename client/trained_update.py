"""What local training gives must be finite before anything of it leaves the client.

A client whose data or model make training diverge (NaN or infinite values) refuses to
answer with that update: `check_trained` raises `NonFiniteUpdate`, naming the reply field
and what was refused, and the value itself is never sent. Before, a plain reply carried
the NaN update and loss to the coordinator, and a clipped one failed inside the clipper
with a traceback on the device. The check is the client's, whatever the coordinator checks.
"""

from __future__ import annotations

import math

import torch

from fedveil.protocol import fields as F
from fedveil.protocol.envelope import all_finite


class NonFiniteUpdate(ValueError):
    """Local training gave a NaN or infinite update or loss: not sent (a client failure
    on a valid request, not a bad message)."""


def check_trained(round_num: int, delta: torch.Tensor, loss: float | None) -> None:
    """Raise NonFiniteUpdate unless every value of `delta` and the `loss` (None: a reply
    without one, e.g. DP-SGD's) are finite numbers."""
    # Worded as the coordinator's own checks word them, so its drop counts name the
    # same check ("NaN or Inf in the update", "loss") whichever side refused.
    if not all_finite(delta):
        bad = int((~torch.isfinite(delta)).sum())
        raise NonFiniteUpdate(
            f"array {F.DELTA!r} contains NaN or Inf ({bad} of {delta.numel()} values) after "
            f"local training in round {round_num}: update refused, not sent"
        )
    if loss is not None and not math.isfinite(loss):
        raise NonFiniteUpdate(
            f"{F.LOSS} = {loss!r} after local training in round {round_num}: update refused, "
            "not sent"
        )
