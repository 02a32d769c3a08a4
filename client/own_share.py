"""A client's own-share-only epsilon against the coordinator, and its local cap.

A distributed-DP plan sizes each client's Skellam noise share so that `min_honest`
shares reach the stated z; `min_honest` assumes at most `secagg.adversarial_rate` of a
cohort is corrupt. The operator enrols devices, so a coordinator can fill a cohort with
devices it controls: then the one share a client can trust is its own, at
z_own = params.noise_multiplier_for(1) (z / sqrt(min_honest)). This account composes
that figure over the masked inputs the client sent, with the project's Skellam
accountant, unamplified (`individual_epsilon`: the coordinator knows the cohorts), and
refuses a masked input that would take the client past its cap. It is the epsilon that
holds whoever else is in the cohort; the stated one holds under the enrolment
assumption.

Both figures, and the epsilon the run states against the coordinator, count at most the
participations the client's own run config allows: `server.rounds` masked inputs in a
synchronous run (one per round), `server.max_participations` in an asynchronous one. A
coordinator that asks for more (rounds past the run's end, a second session in a round)
would compose the client's releases past every stated figure: the account refuses the
masked input past that limit, whatever the cap. The count is the client's
`RunMaskedInputs` (client/masked_input_counts.py): on a device it is kept in the state
directory and recorded before the masked input is computed, so a restart does not reset
it; a count file it cannot trust is a refusal, never a count of zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from fedveil.privacy.dp.accounting import individual_epsilon
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol.dp_rules import POISSON
from fedveil.protocol.envelope import MessageError

if TYPE_CHECKING:
    from fedveil.client.masked_input_counts import RunMaskedInputs
    from fedveil.privacy.dp.distributed_plan import DistributedDpPlan


class OwnShareRefusal(MessageError):
    """A masked input that would take this client past its own-share-only cap."""


class OwnShareAccount:
    """Participations per client of one run, and the epsilons they compose to.

    `cap`: the most own-share-only epsilon a client accepts (None: no cap).
    `limit`: the most masked inputs the run config allows a client, and the setting that
    says so (None: no limit). `counts`: where the client's masked inputs of this run are
    counted (a device's state directory; None: in memory)."""

    def __init__(
        self,
        plan: DistributedDpPlan,
        delta: float,
        cap: float | None,
        limit: tuple[int, str] | None = None,
        counts: RunMaskedInputs | None = None,
    ) -> None:
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"own-share-only epsilon cap = {cap!r}: must be a finite number > 0")
        self.plan, self.delta, self.cap, self.limit = plan, delta, cap, limit
        self.own_z = _z_or_zero(lambda: plan.params.noise_multiplier_for(1, plan.neighbouring))
        if counts is None:
            from fedveil.client.masked_input_counts import MaskedInputCounts

            counts = MaskedInputCounts().for_run("memory")
        self.counts = counts

    def _event(self, z: float) -> PrivacyEvent:
        return PrivacyEvent(
            noise_multiplier=z,
            sampling_rate=1.0,
            sampling=POISSON,
            neighbouring=self.plan.neighbouring,
        )

    def epsilon(self, participations: int) -> float:
        """Own-share-only epsilon after `participations` masked inputs (inf: unbounded,
        e.g. an adjacency with no individual bound)."""
        return self._compose(self.own_z, participations)

    def stated_epsilon(self, participations: int) -> float:
        """The same at the plan's `min_honest` honest shares (what the run states)."""
        return self._compose(_z_or_zero(lambda: self.plan.noise_multiplier), participations)

    def _compose(self, z: float, participations: int) -> float:
        if participations <= 0:
            return 0.0
        if not (z > 0):  # no noise at all: nothing bounds it
            return math.inf
        try:
            return individual_epsilon([self._event(z)] * participations, self.delta)
        except ValueError:
            return math.inf

    def admit(self, client_id: int) -> float:
        """Count one more masked input of `client_id` (recorded before it is computed) and
        return its own-share-only epsilon after it; refused (and not counted) past the run's
        limit or the cap, or when the count cannot be read."""
        after = self.participations(client_id) + 1
        if self.limit is not None and not (after <= self.limit[0]):
            most, setting = self.limit
            raise OwnShareRefusal(
                f"this masked input would be client {client_id}'s participation {after} in "
                f"this run; its run config allows at most {most} ({setting}), the most the "
                "epsilon stated against the coordinator covers: more would compose its "
                "noise shares past that figure, so it is refused"
            )
        eps = self.epsilon(after)
        if self.cap is not None and not (eps <= self.cap):
            raise OwnShareRefusal(
                f"local policy: this masked input would bring this device's own-share-only "
                f"epsilon against the coordinator to {eps:.4g} after {after} participations "
                f"(its own noise share alone, z = {self.own_z:.4g}: the figure if every other "
                f"cohort member is the coordinator's), above its cap {self.cap:g} "
                "(--max-own-share-epsilon)"
            )
        self.counts.record(client_id, after)
        return eps

    def participations(self, client_id: int) -> int:
        """The masked inputs `client_id` sent in this run so far."""
        return self.counts.get(client_id)


def _z_or_zero(z: Callable[[], float]) -> float:
    """A noise multiplier, 0.0 where the shares carry no noise (an audit's cut plan)."""
    try:
        return z()
    except (ZeroDivisionError, ValueError):
        return 0.0
