"""The secure-aggregation server never holds the cohort's n masked inputs (n x d) at once.

Each reply is taken into the protocol's running sum as the transport hands it over
(`Transport.exchange(..., on_reply=...)`), so at most the transport's in-flight replies
are alive: one in the in-process lane, a chunk per worker with worker processes. The
transport below counts, with weak references, the masked-input replies alive at any
moment; on the old path (every reply returned at once in a dict) that count reached
the cohort's size.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

import pytest

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.inprocess import InProcessTransport

COHORT = 10


class LiveReplies:
    """The real transport, counting the masked-input replies (Envelopes of d values)
    that are alive: a weak reference's finalizer counts each one's release."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.live = 0
        self.peak = 0
        self.seen = 0

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        masked = {c for c, m in requests.items() if m.kind == Kind.SECAGG_MASKED_INPUT}

        def forward(cid: int, reply: Envelope | ClientFailure) -> None:
            self._track(cid in masked, reply)
            assert on_reply is not None
            on_reply(cid, reply)

        if on_reply is None:
            replies = self.inner.exchange(requests, timeout_s)
        else:
            replies = self.inner.exchange(requests, timeout_s, on_reply=forward)
        for cid, reply in replies.items():
            self._track(cid in masked, reply)
        return replies

    def _track(self, masked: bool, reply: Envelope | ClientFailure) -> None:
        if not masked or not isinstance(reply, Envelope):
            return
        self.seen += 1
        self.live += 1
        self.peak = max(self.peak, self.live)
        weakref.finalize(reply, self._released)

    def _released(self) -> None:
        self.live -= 1

    def close(self) -> None:
        self.inner.close()


def _run(tmp_path, workers: int) -> tuple[RoundEngine, LiveReplies]:
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": COHORT,
            "server.rounds": 2,
            "secagg.enabled": True,
            "out": str(tmp_path / "run"),
        },
    )
    task = tiny_task.make(cfg)
    privacy, channel = make_privacy_pipeline(cfg, task, cfg.out + "-ledger.jsonl")
    with InProcessTransport(task, workers=workers) as inner:
        counted = LiveReplies(inner)
        engine = RoundEngine(cfg, task, counted, channel=channel, privacy=privacy)
        engine.run()
    return engine, counted


def test_the_secagg_server_holds_one_masked_input_at_a_time_in_process(tmp_path):
    engine, counted = _run(tmp_path, workers=1)
    assert all(r.applied and r.cohort_aggregated == COHORT for r in engine.history)
    assert counted.seen == 2 * COHORT  # every masked input went through the count
    # One reply being summed, and at most the previous one not yet let go of.
    assert counted.peak <= 2, f"{counted.peak} masked inputs alive at once (cohort {COHORT})"
    assert counted.live == 0


@pytest.mark.procs
def test_with_worker_processes_at_most_the_chunks_in_flight_are_held(tmp_path):
    engine, counted = _run(tmp_path, workers=2)
    assert all(r.applied and r.cohort_aggregated == COHORT for r in engine.history)
    assert counted.seen == 2 * COHORT
    # A chunk comes back from a worker and is handed over before the next is read.
    assert counted.peak < COHORT, f"{counted.peak} masked inputs alive at once"
