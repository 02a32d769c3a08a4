"""The small interface the round engine is written against.

A transport knows which clients exist and can deliver one Envelope to each of
a set of clients and collect their replies by a deadline. Flower (simulation
and deployment) and the in-process engine implement it; the round logic,
secure aggregation and DP run unchanged over any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from fedveil.protocol.envelope import Envelope


class ClientFailure(Exception):
    """A client did not produce a usable reply (error, timeout, bad message)."""

    def __init__(self, client_id: int, reason: str) -> None:
        super().__init__(f"client {client_id}: {reason}")
        self.client_id = client_id
        self.reason = reason


class Transport(Protocol):
    def client_ids(self) -> Sequence[int]:
        """The logical ids of the clients that can be sampled."""
        ...

    def exchange(
        self, requests: Mapping[int, Envelope], timeout_s: float | None
    ) -> dict[int, Envelope | ClientFailure]:
        """Send each request to its client; return a reply or failure per client."""
        ...

    def close(self) -> None: ...
