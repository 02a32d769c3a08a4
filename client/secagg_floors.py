"""A client's own floors on a secure-aggregation session, from the run config it holds.

Every client path computes them here, from its own copy of the run config and never from
a message: the session floor (privacy/secagg/session_floor.py: the threat mode, degree
and threshold the run's `secagg.adversarial_rate`, `secagg.dropout_rate` and
`secagg.threat` allow) and, where the run sets one, the fewest survivors the client
reveals unmasking shares for. fedveil's own client runtime (client/runtime.py) and the
mod around a stock Flower strategy (client/flower_secagg_mod.py) both use
`session_floor_of`; a refusal to compute a floor is a MessageError naming the setting.
"""

from __future__ import annotations

from fedveil.config import RunConfig
from fedveil.privacy.secagg import ThreatModel
from fedveil.privacy.secagg.cohort_bounds import survivor_floor
from fedveil.privacy.secagg.session_floor import SessionFloor
from fedveil.protocol.envelope import MessageError


def session_floor_of(cfg: RunConfig, population: int) -> SessionFloor:
    """The threat model of `cfg` that every session must meet; `population`: the run's
    number of clients (the largest cohort a semi-honest client's view can stand for)."""
    s = cfg.secagg
    try:
        threat = ThreatModel(s.adversarial_rate, s.dropout_rate, s.threat)
    except ValueError as exc:
        raise MessageError(f"this client's secagg threat model: {exc}") from None
    return SessionFloor(threat, population)


def cohort_survivor_floor(cfg: RunConfig, population: int) -> int:
    """The fewest survivors a round of `cfg`'s cohorts may unmask with: the cohort it
    samples (`server.per_round`, or a small Poisson cohort) less its expected dropouts
    (`secagg.dropout_rate`), at least 2 (privacy/secagg/cohort_bounds.py, the same bound
    a distributed-DP plan's survivor floor is)."""
    return survivor_floor(cfg.dp_parameters(), population, 0)
