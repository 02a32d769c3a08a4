"""DP without sampling: asynchronous participation, capped per client.

Asynchronous training (FedBuff, stale-synchronous) dispatches whichever clients are
available, so no release is amplified by sampling: each release is an unsampled
Gaussian mechanism (q = 1). What bounds a client's epsilon is how many releases it
can be in. The engine caps that at P = server.max_participations (it never dispatches
a client a (P+1)-th time, and every dispatched update lands in at most one release),
so by adaptive composition (a release without the client's update has zero privacy
loss for it, whatever the model it started from) every client's epsilon is at most
the composition of the P releases with the least noise.

That bound is a function of the public ledger alone (the parameters of its releases
and the cap), stated before the run (P releases at the run's z) and, after n
releases, the composition of min(n, P) of them: so what is published never depends
on how often anyone took part. The realised figure (the busiest client's releases)
counts participations and belongs to the operator's private annex only.

The accountants are the library ones (accounting.compute_epsilon: Opacus' RDP by
default); this module only chooses which events a client can be in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .accounting import compute_epsilon
from .events import PrivacyEvent, event_from_entry


class ParticipationCapError(RuntimeError):
    """A client would be dispatched past server.max_participations."""


def capped_events(events: Iterable[PrivacyEvent], cap: int | None) -> list[PrivacyEvent]:
    """The events a client can be in when it takes part in at most `cap` of them.

    The `cap` least-noisy events (the worst case for the client); all of them when
    `cap` is None (synchronous: every release composes). Steps count as releases.
    """
    if cap is None:
        return list(events)
    if cap < 1:
        raise ValueError(f"participation cap={cap!r} is invalid; allowed: an integer >= 1")
    taken: list[PrivacyEvent] = []
    left = cap
    for event in sorted(events, key=lambda e: e.noise_multiplier):
        if left <= 0:
            break
        # One event may stand for several releases (steps); take only what fits.
        taken.append(replace(event, steps=min(event.steps, left)))
        left -= taken[-1].steps
    return taken


def participation_bound(
    events: Sequence[PrivacyEvent], cap: int, delta: float, accountant: str
) -> float:
    """Epsilon of any client that took part in at most `cap` of these releases."""
    return compute_epsilon(capped_events(events, cap), delta, accountant)


def cap_bound(event: PrivacyEvent, cap: int, delta: float, accountant: str) -> float:
    """The bound stated before the run: `cap` releases of `event` (unsampled)."""
    return compute_epsilon([replace(event, steps=cap)], delta, accountant)


class ParticipationCap:
    """Dispatch gate: counts every dispatch of every client, refuses one past the cap.

    Counts dispatches, not applied updates: an update dropped as stale or lost with
    its group still counts, so the releases a client is in never exceed its dispatches,
    and a crash between dispatch and release can only over-count (conservative).
    """

    def __init__(self, cap: int, counts: Mapping[int, int] | None = None) -> None:
        if not (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1):
            raise ValueError(
                f"server.max_participations = {cap!r}: allowed: an integer >= 1 under DP"
            )
        self.cap = cap
        self._counts: dict[int, int] = {int(c): int(n) for c, n in (counts or {}).items()}
        over = {c: n for c, n in self._counts.items() if n > cap}
        if over:
            raise ParticipationCapError(
                f"{len(over)} clients already past server.max_participations = {cap}"
            )

    def count(self, client: int) -> int:
        return self._counts.get(int(client), 0)

    def admits(self, client: int) -> bool:
        """May `client` be dispatched once more?"""
        return self.count(client) < self.cap

    def eligible(self, clients: Iterable[int]) -> list[int]:
        """The clients (in the given order) that may still be dispatched."""
        return [c for c in clients if self.admits(c)]

    def dispatch(self, client: int) -> int:
        """Count one dispatch of `client` (call BEFORE it is sent); its count after."""
        if not self.admits(client):
            raise ParticipationCapError(
                f"client {client} was dispatched {self.count(client)} times: "
                f"server.max_participations = {self.cap} forbids another"
            )
        self._counts[int(client)] = self.count(client) + 1
        return self._counts[int(client)]

    @property
    def counts(self) -> dict[int, int]:
        """Per-client dispatch counts: participation, so the operator's only."""
        return dict(self._counts)

    def busiest(self) -> int:
        return max(self._counts.values(), default=0)

    def exhausted(self, population: Iterable[int]) -> bool:
        """True when no client of `population` may be dispatched again."""
        return not any(self.admits(c) for c in population)


def participation_section(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The public report's part for a capped (asynchronous) run, from one release entry
    (or the config's stand-in): the cap and the bound stated before the run, no counts."""
    cap = int(entry["max_participations"])
    event = event_from_entry({**entry, "steps": 1})
    bound = cap_bound(event, cap, float(entry["delta"]), str(entry["accountant"]))
    return {
        "max_participations": cap,
        "epsilon_cap_bound": bound,
        "statement": (
            "asynchronous training: no sampling, so no amplification (q = 1); each client "
            f"is dispatched at most {cap} times (server.max_participations) and each update "
            f"is in at most one release, so any client's epsilon is at most that of {cap} "
            "releases. The epsilon shown is that bound for the releases so far; how often "
            "any client actually took part is kept private"
        ),
    }
