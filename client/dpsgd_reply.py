"""What a DP-SGD update's reply says besides the update: nothing computed from the data.

DP-SGD's guarantee covers the noised update and nothing else. A reply's example count
(and the rate batch / n, and the steps, which give n), or its exact training loss, are
statistics of the device's data outside that guarantee: an observer inverted a published
per-client epsilon to one client's exact n, and read a client's exact loss. So under
DP-SGD a reply carries constants only: one vote (`num_examples = 1`, `weight = 1`) and
`loss = 0` (the protocol's required fields; the server publishes no training loss for a
DP-SGD run). Example weighting would need n on the server, so DP-SGD updates are
averaged uniformly: a request that asks for `weighting = "examples"` is refused, naming
the field. Each device accounts its own epsilon (client/dpsgd_budget.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedveil.protocol import fields as F
from fedveil.protocol.envelope import MessageError


def dp_sgd_reply(config: Mapping[str, Any]) -> dict[str, Any]:
    """The reply fields of a DP-SGD update, whatever the data: constants only."""
    weighting = config.get(F.WEIGHTING, F.WEIGHT_UNIFORM)
    if weighting != F.WEIGHT_UNIFORM:
        raise MessageError(
            f"train message: weighting = {weighting!r} with DP-SGD (dp_sgd_noise > 0): "
            f"this client sends no example count under DP-SGD (it is outside the "
            f"example-level guarantee), so its update is weighted {F.WEIGHT_UNIFORM!r}"
        )
    return {F.NUM_EXAMPLES: 1, F.LOSS: 0.0, F.WEIGHT: 1.0}
