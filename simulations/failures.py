"""A run in which no client's update was ever aggregated fails, saying why.

Without this a task whose clients all fail (float labels under cross-entropy, say) ran
to its end, exited 0 and reported the untrained model's accuracy. The decision reads
the engine's round records (`cohort_aggregated`), so it holds under DP too, where a
round is applied (noise alone) even with no contributor. The cause is the first client
failure the transport returned, kept by `FailureLog`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.rounds import RoundRecord
from fedveil.server.engine.transport import (
    CentralEvaluator,
    ClientFailure,
    ReplySink,
    RoundReporter,
    Transport,
)


class RunFailed(RuntimeError):
    """Every client failed: the run directory is written, the exit status is non-zero."""


class FailureLog:
    """Wraps a transport and keeps the first client failure it returns (and how many)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.first: ClientFailure | None = None
        self.count = 0

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        def note(cid: int, reply: Envelope | ClientFailure) -> None:
            self._note(reply)
            assert on_reply is not None
            on_reply(cid, reply)

        replies = self.inner.exchange(
            requests, timeout_s, on_reply=None if on_reply is None else note
        )
        for reply in replies.values():
            self._note(reply)
        return replies

    def _note(self, reply: Envelope | ClientFailure) -> None:
        if isinstance(reply, ClientFailure):
            self.count += 1
            if self.first is None:
                self.first = reply

    def evaluate_central(
        self, weights: torch.Tensor, round_num: int, batch_size: int
    ) -> tuple[float, float, int] | None:
        if isinstance(self.inner, CentralEvaluator):
            return self.inner.evaluate_central(weights, round_num, batch_size)
        return None

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        if isinstance(self.inner, RoundReporter):
            return self.inner.round_report(round_num)
        return {}


def check_some_client_contributed(records: Iterable[RoundRecord], failures: FailureLog) -> None:
    """Raise RunFailed when rounds had cohorts but no client's update was ever aggregated."""
    records = list(records)
    if not any(r.cohort_planned for r in records) or any(r.cohort_aggregated for r in records):
        return
    rounds = len(records)
    if failures.first is None:
        cause = "no client's update was aggregated (see the run's metrics and log)"
    else:
        # The reason only: under DP which client failed is the operator's annex's business.
        cause = f"first cause: {failures.first.reason}"
    raise RunFailed(
        f"every client failed in all {rounds} round(s); the model was never trained; {cause}"
    )
