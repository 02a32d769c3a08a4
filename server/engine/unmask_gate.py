"""What a round's update channel can end with besides a sum: an abort, and where it fell.

The stage matters for privacy: an abort before unmasking revealed nothing (nothing is
applied and nothing is charged); one after unmasking let the server see the sum, so
under distributed DP it stays charged to the coordinator's epsilon.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Aborted:
    reason: str
    unmasked: bool  # whether any unmasking request went out before the abort
    dropped: dict[int, str] = field(default_factory=dict)

    @property
    def stage(self) -> str:
        return "after_unmask" if self.unmasked else "before_unmask"


class UnmaskGate(Protocol):
    """Called by a secure-aggregation channel right before the first unmasking request.

    It checks the survivor set and charges the release durably, or raises
    SecAggAborted: then no request goes out and the sum is never reconstructed.
    """

    def before_unmask(self, round_num: int, survivors: frozenset[int]) -> None: ...
