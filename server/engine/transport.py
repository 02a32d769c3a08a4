"""The interface the round engine is written against.

A transport knows which clients exist and can deliver one Envelope to each of
a set of clients and collect their replies by a deadline. Flower (simulation
and deployment) and the in-process engine implement it; the round logic,
secure aggregation and DP run unchanged over any of them.

Replies as they arrive: `exchange(..., on_reply=sink)` lets a transport hand each
reply to `sink` the moment it has it, instead of gathering all of them. Every reply
is either handed to the sink or returned, never both; a client neither handed over nor
returned had no reply. Secure aggregation passes a sink that folds each masked input
into the running sum, so the server never holds the cohort's n replies of d values at
once: only what the transport has in flight. The real transports (in-process, Flower's
Grid, the coordinator's deployment) hand replies over as they come; a transport that
can only gather them all (a test double) may ignore the sink and return them.

Three optional capabilities, declared here and checked with `isinstance`:
`CentralEvaluator` (a transport with idle workers may evaluate the global model
on the task's test set for the server), `RoundReporter` (a transport or
update channel adds facts only it knows to the round's record) and `FirstReplies`
(an exchange that ends at its first R usable replies: an asynchronous secure-
aggregation group released at R of G, or its unmask stage ended at t replies).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from fedveil.protocol.envelope import Envelope

if TYPE_CHECKING:
    import torch


class ClientFailure(Exception):
    """A client did not produce a usable reply (error, timeout, bad message)."""

    def __init__(self, client_id: int, reason: str) -> None:
        super().__init__(f"client {client_id}: {reason}")
        self.client_id = client_id
        self.reason = reason


# on_reply(client id, its reply or failure): called once per client, as each arrives. A
# sink returns False for a reply it refused (the protocol server rejected it): that reply
# is not usable and does not count towards a FirstReplies quorum; None or True: an
# Envelope is usable.
ReplySink = Callable[[int, "Envelope | ClientFailure"], "bool | None"]


class Transport(Protocol):
    def client_ids(self) -> Sequence[int]:
        """The logical ids of the clients that can be sampled."""
        ...

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """Send each request to its client; a reply or failure per client. With
        `on_reply`, replies may be handed to it as they arrive (each once) instead of
        returned: the dict holds only the rest (see the module docstring)."""
        ...

    def close(self) -> None: ...


# (mean loss, accuracy, examples) of the global model on the task's test set.
CentralResult = tuple[float, float, int]


@runtime_checkable
class CentralEvaluator(Protocol):
    """A transport that can run the server's own evaluation (the in-process engine's
    workers, idle between exchanges)."""

    def evaluate_central(
        self, weights: torch.Tensor, round_num: int, batch_size: int
    ) -> CentralResult | None:
        """The evaluation of `weights`, or None: the engine evaluates in its own process.
        Must equal the engine's own evaluation bit for bit."""
        ...


@runtime_checkable
class RoundReporter(Protocol):
    """A transport or update channel with facts about a round that only it knows
    (simulated dropouts; the secure-aggregation mode and parameters)."""

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        """Fields for round `round_num`'s record (empty: nothing to add)."""
        ...


# Why a client is left out of an exchange ended at its first R replies (FirstReplies).
LEFT_OUT = "left out by design"


@runtime_checkable
class FirstReplies(Protocol):
    """A transport that can end an exchange once `quorum` clients have replied (the
    simulated clock's StagedAvailability; the coordinator's DeployTransport)."""

    def exchange_first(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        quorum: int,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        """As `exchange` (`on_reply` included), but it returns at the first `quorum`
        usable replies (or the deadline; a reply the sink refused does not count): every
        client not among them is a ClientFailure whose reason starts with LEFT_OUT, and a
        reply it sends later is never returned by any exchange, nor handed to the sink."""
        ...
