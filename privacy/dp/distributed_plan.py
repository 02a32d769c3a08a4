"""`DistributedDpPlan`: the run-constant distributed-DP parameters that the server and
every client hold (computed by plan.py, checked by async_plan.py for asynchronous
groups, pinned by each client)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .skellam import SkellamParams


@dataclass(frozen=True)
class DistributedDpPlan:
    """Run-constant distributed-DP parameters, held by the server and by every client.

    `min_survivors`: fewest masked inputs a round may unmask. Of those, up to `corrupt`
    may belong to clients that `secagg.adversarial_rate` allows to be corrupt (their
    noise shares do not count), so at least `min_honest` honest shares are in every
    unmasked sum; the shares are sized so that `min_honest` of them reach z.
    """

    params: SkellamParams
    min_survivors: int
    min_honest: int
    corrupt: int
    neighbouring: str

    @property
    def noise_multiplier(self) -> float:
        """Gaussian-equivalent z of every unmasked sum (at `min_honest` honest shares)."""
        return self.params.noise_multiplier_for(self.min_honest, self.neighbouring)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params.to_dict(),
            "min_survivors": self.min_survivors,
            "min_honest": self.min_honest,
            "corrupt": self.corrupt,
            "neighbouring": self.neighbouring,
        }
