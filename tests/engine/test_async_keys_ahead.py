"""Async secure aggregation on the simulated clock agrees a group's keys while the groups
in flight train: the group still runs all four protocol stages, in order, as exchanges of
its own; only its key stages move earlier, so once a slot frees it waits for masked input
(with training) and unmask alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import pytest

import tiny_task
from fedveil.config import load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.dispatches import Dispatch
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.simulate_run import simulate

STAGES = ["secagg.advertise", "secagg.share_keys", "secagg.masked_input", "secagg.unmask"]


class Recorder:
    """Every exchange's (round, kind, clients), in the order the server made them."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.log: list[tuple[int, str, tuple[int, ...]]] = []

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        first = next(iter(requests.values()))
        assert {(m.round, m.kind) for m in requests.values()} == {(first.round, first.kind)}
        self.log.append((first.round, first.kind, tuple(sorted(requests))))
        return self.inner.exchange(requests, timeout_s)

    def close(self) -> None:
        self.inner.close()


def run(
    tmp_path, watch: Callable[[RoundEngine], None] | None = None, **extra
) -> tuple[RoundEngine, Recorder]:
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.mode": "async",
        "server.per_round": 6,
        "server.concurrency": 6,
        "server.buffer": 3,
        "server.group_size": 3,
        "server.rounds": 4,
        "secagg.enabled": True,
        # Every exchange takes exactly 1 s: a group's four stages 4 s, two of them 2 s.
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 0.0,
        "simulation.latency_client_sigma": 0.0,
        "out": str(tmp_path),
    }
    cfg = load_config(None, {**values, **extra})
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    recorder = Recorder(InProcessTransport(task))
    engine = RoundEngine(
        cfg,
        task,
        recorder,
        channel=channel,
        scheduler=BufferedScheduler(cfg, availability=AvailabilityModel.from_config(cfg)),
        on_round=None if watch is None else (lambda _record: watch(engine)),
    )
    engine.run()
    return engine, recorder


def test_groups_agree_keys_while_others_train(tmp_path):
    engine, recorder = run(tmp_path)
    clocks = [r.extra["sim_clock_s"] for r in engine.history]
    # t = 0: two groups run all four stages (4 s) and two more agree their keys (ready at
    # 2 s). At 3 s the first groups' members have sent their masked input: they are free
    # (their groups still unmask), the keyed groups take the slots and need masked input
    # and unmask: 5 s, not 8 (four stages after the first groups) nor 6 (a slot held
    # until its group's unmasking ends).
    assert clocks == [4.0, 4.0, 5.0, 5.0]
    assert all(r.cohort_aggregated == 3 for r in engine.history)
    # Each applied group ran the whole protocol, each stage once, in order, to its members.
    applied = [s for r in engine.history for s in r.extra["applied_dispatches"]]
    for seq in applied:
        mine = [(kind, who) for rnd, kind, who in recorder.log if rnd == seq]
        assert [kind for kind, _ in mine] == STAGES
        assert len({who for _, who in mine}) == 1
    # No client trains in two groups at once (keys agreed ahead count as busy).
    busy = [set(u.busy(engine.scheduler.clock.now())) for u in engine.scheduler.in_flight.values()]
    busy += [set(g.clients) for g in engine.scheduler.keyed]
    assert sum(map(len, busy)) == len(set().union(*busy))


def test_without_a_latency_model_every_group_runs_whole_at_dispatch(tmp_path):
    engine, _ = run(tmp_path, **{"simulation.latency_median": 0.0})
    assert not engine.scheduler.keys_ahead and not engine.scheduler.keyed
    assert [r.extra["sim_clock_s"] for r in engine.history] == [1.0, 1.0, 2.0, 2.0]


def test_a_member_that_sent_its_masked_input_trains_again_before_its_group_unmasks(tmp_path):
    """Stragglers hold their group's release, not its fast members: once a member has sent
    its masked input it may join the next group, and no more than C clients ever train."""
    units: dict[int, Dispatch] = {}

    def watch(engine: RoundEngine) -> None:  # the units in flight at each server update
        units.update(engine.scheduler.in_flight)

    engine, recorder = run(
        tmp_path,
        watch,
        **{
            "server.rounds": 8,
            "simulation.latency_sigma": 1.0,
            "simulation.latency_client_sigma": 0.5,
            "simulation.message_latency_share": 0.1,
        },
    )
    assert engine.scheduler.free_early
    units.update(engine.scheduler.in_flight)
    early = 0
    for seq, unit in units.items():
        for other in units.values():
            shared = set(other.clients) & set(unit.clients)
            if other.seq < seq and shared and other.arrival > unit.dispatched_at:
                # `other` still unmasks: its shared members were freed early
                assert all(other.frees[c] <= unit.dispatched_at for c in shared)
                early += 1
        training = sum(
            1
            for u in units.values()
            for c in u.clients
            if u.dispatched_at <= unit.dispatched_at < u.frees[c]
        )
        assert training <= engine.scheduler.concurrency
    assert early > 0
    # Each applied group still ran every stage once, in order, to the same members.
    for seq in [s for r in engine.history for s in r.extra["applied_dispatches"]]:
        assert [kind for rnd, kind, _ in recorder.log if rnd == seq] == STAGES


@pytest.mark.procs
def test_keys_agreed_several_groups_ahead_survive_later_dispatches_and_evaluations(tmp_path):
    """Four slots (C = 12, G = 3): a group's keys are agreed up to three dispatches before
    its masked input goes out, and the model is evaluated centrally (round = the version,
    far behind the dispatch numbers) on the worker pool between. Its members' sessions
    must still be held, on the worker that holds them: every group trains in full."""
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 24,
            "server.mode": "async",
            "server.per_round": 12,
            "server.concurrency": 12,
            "server.buffer": 3,
            "server.group_size": 3,
            "server.rounds": 8,
            "secagg.enabled": True,
            "simulation.workers": 2,
            "simulation.dropout": 0.0,
            "simulation.latency_median": 1.0,
            "simulation.latency_sigma": 1.0,
            "simulation.message_latency_share": 0.1,
            "simulation.plots": False,
            "eval.central_every": 1,
            "out": str(tmp_path),
        },
    )
    simulate(cfg)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for row in rows:
        assert row["status"] == "applied"
        assert row["dropped"] == 0, row["drops_by_reason"]
        assert row["aborted_groups"] == 0
        assert row["cohort_aggregated"] == 3 and len(row["applied_dispatches"]) == 1
