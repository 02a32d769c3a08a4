"""Secure aggregation with the next round's key stages riding on this round's exchanges."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pytest

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.piggyback import RIDER_KIND, attach, detach, join_replies, split_reply
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.inprocess import InProcessTransport


def config(tmp_path, **overrides):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 8,
        "server.rounds": 4,
        "secagg.enabled": True,
        "out": str(tmp_path / "run"),
    }
    values.update(overrides)
    return load_config(None, values)


class Recorder:
    """Counts exchanges per round (by the round of their primary messages)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.exchanges: Counter[int] = Counter()
        self.riders: Counter[int] = Counter()

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        self.exchanges[min(m.round for m in requests.values())] += 1
        self.riders[min(m.round for m in requests.values())] += sum(
            RIDER_KIND in m.config for m in requests.values()
        )
        return self.inner.exchange(requests, timeout_s)

    def close(self) -> None:
        self.inner.close()


class Faults:
    """Per (round, kind): clients whose primary fails (their rider is still answered, as
    by a client whose training failed) or that fail whole (a crashed device)."""

    def __init__(self, inner: Transport, *, primary=None, whole=None, strip_riders=False):
        self.inner = inner
        self.primary = primary or {}
        self.whole = whole or {}
        self.strip_riders = strip_riders

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(self, requests, timeout_s, on_reply=None):
        out: dict[int, Envelope | ClientFailure] = {}
        sent: dict[int, Envelope] = {}
        failing: dict[int, Envelope] = {}
        for cid, msg in requests.items():
            key = (msg.round, msg.kind)
            if cid in self.whole.get(key, ()):
                out[cid] = ClientFailure(cid, "device crashed")
            elif cid in self.primary.get(key, ()):
                failing[cid] = msg
                rider = detach(msg)[1]
                if rider is not None:
                    sent[cid] = rider
            else:
                # A client of an older version answers the primary and ignores the rider.
                sent[cid] = detach(msg)[0] if self.strip_riders else msg
        replies = self.inner.exchange(sent, timeout_s)
        for cid, msg in failing.items():
            reply = replies.pop(cid, None)
            if isinstance(reply, Envelope):
                out[cid] = join_replies("training failed", reply, msg)
            else:
                out[cid] = ClientFailure(cid, "training failed")
        out.update(replies)
        return out

    def close(self):
        self.inner.close()


def run(cfg, wrap=lambda t: t, workers=1):
    task = tiny_task.make(cfg)
    privacy, channel = make_privacy_pipeline(cfg, task, cfg.out + "-ledger.jsonl")
    with InProcessTransport(task, workers=workers) as inner:
        recorder = Recorder(wrap(inner))
        engine = RoundEngine(cfg, task, recorder, channel=channel, privacy=privacy)
        engine.run()
    return engine, recorder


# Two workers: a client's state for the next round must stay with the worker holding it.
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.procs)])
def test_after_the_first_round_a_secure_round_takes_two_exchanges(tmp_path, workers):
    engine, recorder = run(config(tmp_path, **{"server.rounds": 5}), workers=workers)
    # Round 1: advertise, share keys (each carrying round 2's), masked input, unmask;
    # later rounds start at masked input, each carrying the next round's key stage.
    assert [recorder.exchanges[r] for r in (1, 2, 3, 4, 5)] == [4, 2, 2, 2, 2]
    assert [recorder.riders[r] > 0 for r in (1, 2, 3, 4, 5)] == [True, True, True, True, False]
    assert all(r.applied and r.cohort_aggregated == 8 for r in engine.history)


def test_without_pipelining_every_round_runs_all_four_stages(tmp_path):
    engine, recorder = run(config(tmp_path, **{"secagg.pipeline": False}))
    assert [recorder.exchanges[r] for r in (1, 2, 3, 4)] == [4, 4, 4, 4]
    assert sum(recorder.riders.values()) == 0
    assert all(r.applied and r.cohort_aggregated == 8 for r in engine.history)


def test_pipelined_and_sequential_rounds_give_the_same_model(tmp_path):
    a, _ = run(config(tmp_path / "a"))
    b, _ = run(config(tmp_path / "b", **{"secagg.pipeline": False}))
    # The same cohorts in the same order; only stochastic rounding differs.
    assert float((a.weights - b.weights).abs().max()) < 1e-4


def test_a_client_whose_training_fails_still_keys_the_next_round(tmp_path):
    cfg = config(tmp_path, **{"server.per_round": 12})
    engine, _ = run(cfg, lambda t: Faults(t, primary={(2, "secagg.masked_input"): {3}}))
    assert [r.cohort_aggregated for r in engine.history] == [12, 11, 12, 12]
    assert all(r.applied for r in engine.history)


def test_a_crashed_client_misses_its_round_and_the_next_ones_keys(tmp_path):
    cfg = config(tmp_path, **{"server.per_round": 12})
    engine, _ = run(cfg, lambda t: Faults(t, whole={(2, "secagg.masked_input"): {3}}))
    # Its masks in round 2 are removed at unmasking; it never advertised keys for round 3.
    assert [r.cohort_aggregated for r in engine.history] == [12, 11, 11, 12]
    assert engine.history[2].dropped == 1


def test_clients_that_ignore_riders_fall_back_to_four_exchanges(tmp_path):
    engine, recorder = run(config(tmp_path), lambda t: Faults(t, strip_riders=True))
    assert [recorder.exchanges[r] for r in (1, 2, 3, 4)] == [4, 4, 4, 4]
    assert all(r.applied and r.cohort_aggregated == 8 for r in engine.history)


class Garbage:
    """Client 2 answers every request with fields no stage knows (a faulty client)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(self, requests, timeout_s, on_reply=None):
        out = self.inner.exchange(requests, timeout_s)
        if 2 in requests:
            out[2] = Envelope(requests[2].kind, requests[2].round, {"junk": 1})
        return out

    def close(self):
        self.inner.close()


def test_garbage_from_a_faulty_client_does_not_turn_pipelining_off(tmp_path):
    cfg = config(tmp_path, **{"server.per_round": 12})
    engine, recorder = run(cfg, Garbage)
    assert [recorder.exchanges[r] for r in (1, 2, 3, 4)] == [4, 2, 2, 2]
    assert [r.cohort_aggregated for r in engine.history] == [11, 11, 11, 11]


def test_a_resumed_run_uses_the_cohort_it_had_drawn(tmp_path):
    cfg = config(tmp_path, **{"server.rounds": 3})
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    first = RoundEngine(cfg, task, InProcessTransport(task), channel=channel, store=store)
    first.run_round()
    drawn = first.scheduler.upcoming
    assert drawn is not None and len(drawn) == 8
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    resumed = RoundEngine(cfg, task, InProcessTransport(task), channel=channel, store=store)
    resumed.restore(store.load_checkpoint())
    assert resumed.scheduler.upcoming == drawn
    record = resumed.run_round()  # the early key exchange died with the process: afresh
    assert record.round == 2 and record.cohort_planned == 8 and record.applied


# -- the envelope format -----------------------------------------------------------------


def test_a_rider_travels_and_comes_back_intact():
    primary = Envelope("secagg.unmask", 4, {"sa.a": 1}, {"sa.v": [1, 2]})
    rider = Envelope("secagg.share_keys", 5, {"sa.a": 2, "sa.b": b"x"}, {"sa.v": [3]})
    sent = attach(primary, rider)
    assert sent.kind == "secagg.unmask" and sent.round == 4
    got_primary, got_rider = detach(sent)
    assert got_primary == primary and got_rider == rider
    reply = join_replies(Envelope("secagg.unmask", 4, {"sa.r": 7}), got_rider, sent)
    mine, theirs = split_reply(reply, rider)
    assert mine == Envelope("secagg.unmask", 4, {"sa.r": 7})
    assert theirs == rider
    failed = join_replies("training failed", "keys failed", sent)
    assert split_reply(failed, rider) == ("training failed", "keys failed")
    unanswered = split_reply(Envelope("secagg.unmask", 4, {"sa.r": 7}), rider)[1]
    assert unanswered == "no answer to the secagg.share_keys it carried"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"rider:kind": 3, "rider:round": 5}, "rider:kind"),
        ({"rider:kind": "secagg.advertise"}, "rider:round"),
        ({"rider:kind": "secagg.advertise", "rider:round": True}, "rider:round"),
    ],
)
def test_a_malformed_rider_is_refused_naming_the_field(config, field):
    with pytest.raises(MessageError, match=field):
        detach(Envelope("secagg.unmask", 4, config))
