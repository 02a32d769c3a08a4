"""A client's own floor on the session a server sends: threat mode, degree k, threshold t.

The server picks k and t (params.find_parameters) from the run's threat model, but a
guarantee against the server cannot rest on its choice: a client checks the session of
every advertise request against the threat model of its own run config (never one a
message carries) before it makes a key:

- a run with `secagg.threat = 'malicious'` takes no semi-honest session (no signed key
  adverts, no consistency round);
- the threshold t is at least `params.min_safe_threshold(n, k, threat)`, the lowest t
  with which the server and the corrupt clients the run allows (`adversarial_rate`)
  cannot reconstruct a live client's secrets; a degree k for which no t is safe (the
  corrupt and dropped clients may disconnect the honest survivors) is refused.

A malicious-mode client holds the full session, so n is known and the floor is exact. A
semi-honest client holds only its view (view.SessionView: no cohort list, by design), so
it checks the weakest floor of any cohort size its view allows: n from the largest share
x-coordinate it sees (x is a cohort position) and k + 1 up to the run's population. That
never refuses an honest session and still refuses a threshold below every such floor.
Each refusal is a SecAggProtocolError naming the field, the value and the limit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .errors import SecAggProtocolError
from .params import ThreatMode, ThreatModel, min_safe_threshold
from .session import SessionConfig
from .view import SessionView


@functools.lru_cache(maxsize=64)
def _weakest_floor(first_n: int, last_n: int, k: int, threat: ThreatModel) -> int | None:
    """The lowest safe threshold over cohort sizes first_n..last_n (None: none is safe)."""
    floors: list[int] = []
    for n in range(first_n, last_n + 1):
        try:
            floor = min_safe_threshold(n, k, threat)
        except ValueError:  # k is no valid degree for this n
            continue
        if floor is not None:
            floors.append(floor)
    return min(floors, default=None)


def check_session_floor(
    session: SessionConfig | SessionView, threat: ThreatModel, population: int, path: str
) -> None:
    """Refuse `session` if it is weaker than `threat` allows (see the module doc).
    `population`: the run's number of clients, the largest cohort a semi-honest client's
    view can stand for."""
    if threat.mode is ThreatMode.MALICIOUS and not session.malicious:
        raise SecAggProtocolError(
            f"{path}.threat_mode = {session.threat_mode.value!r}; this client's run says "
            "secagg.threat = 'malicious' (signed key adverts and a consistency round): a "
            "semi-honest session is weaker than its plan"
        )
    rates = (
        f"secagg.adversarial_rate = {threat.adversarial_rate:g}, "
        f"secagg.dropout_rate = {threat.dropout_rate:g}, threat {session.threat_mode.value}"
    )
    try:
        # At the session's own mode: a malicious session is held to the (higher) malicious
        # floor, whatever the run's mode.
        at = ThreatModel(threat.adversarial_rate, threat.dropout_rate, session.threat_mode)
    except ValueError as exc:
        raise SecAggProtocolError(f"{path}.threat_mode: {exc}") from None
    k = session.neighbors
    if isinstance(session, SessionConfig):
        cohort = f"n = {session.n} clients"
        floor = _weakest_floor(session.n, session.n, k, at)
    else:
        first = max(k + 1, max(session.neighbourhood_xs))
        cohort = f"any cohort of {first} to {population} clients"
        floor = _weakest_floor(first, max(first, population), k, at)
    if floor is None:
        raise SecAggProtocolError(
            f"{path}.neighbors = {k} for {cohort}: under this client's threat model "
            f"({rates}) no threshold makes that degree secure (the corrupt and dropped "
            "clients may disconnect the honest survivors)"
        )
    if not (session.threshold >= floor):
        raise SecAggProtocolError(
            f"{path}.threshold = {session.threshold}; this client's threat model ({rates}) "
            f"needs threshold >= {floor} for {cohort} and {k} neighbours: below it the "
            "server and the corrupt clients the run allows could reconstruct a live "
            "client's secrets"
        )


@dataclass(frozen=True)
class SessionFloor:
    """A client's floor for its run: its own threat model and the run's population."""

    threat: ThreatModel
    population: int

    def check(self, session: SessionConfig | SessionView, path: str) -> None:
        check_session_floor(session, self.threat, self.population, path)
