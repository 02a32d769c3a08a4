"""Rolling dispatch of asynchronous secure-aggregation groups (server.group_dispatch_at =
S < G): a group goes out once S training slots are free, and each other member starts to
train as a slot comes free, where a group dispatched at once waits until G slots are free
together. The group is the same session (its members, R, the threshold): the scheduling
admits groups the old one could not, never more than C clients train at any moment, and
a recomputed group (resume) leaves out the same members."""

from __future__ import annotations

import re

import pytest

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.dispatches import Dispatch
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import LEFT_OUT
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport

C, G, R = 6, 5, 3


def config(tmp_path, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 14,
        "server.mode": "async",
        "server.per_round": C,
        "server.concurrency": C,
        "server.buffer": R,  # one group's release is one server update
        "server.group_size": G,
        "server.group_release_at": R,
        "server.group_dispatch_at": 1,  # the extreme: out with one slot free
        "server.rounds": 6,
        "secagg.enabled": True,
        "secagg.dropout_rate": 0.4,  # covers the G - R = 2 members left out by design
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "simulation.latency_client_sigma": 0.5,
        "simulation.message_latency_share": 0.1,
        "out": str(tmp_path),
    }
    values.update(extra)
    return load_config(None, values)


def engine_for(cfg, tmp_path, seen: dict[int, Dispatch] | None = None) -> RoundEngine:
    """The engine; `seen` collects every unit in flight after each server update (with
    K = R each group's arrival is one update, so every dispatched group is seen)."""
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    scheduler = BufferedScheduler(cfg, availability=AvailabilityModel.from_config(cfg))

    def watch(_record) -> None:
        if seen is not None:
            seen.update(scheduler.in_flight)

    engine = RoundEngine(
        cfg, task, InProcessTransport(task), channel=channel, scheduler=scheduler, on_round=watch
    )
    return engine


def most_training_at_once(units: list[Dispatch]) -> int:
    """The most members training at one simulated time: from its start (rolling: its
    slot free and keys agreed) until it sent its masked input or was left out."""
    events = []
    for u in units:
        for c in u.clients:
            start, free = u.starts[c], u.frees[c]
            if free > start:
                events += [(start, 1), (free, -1)]
    most = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # a free before a start
        now += step
        most = max(most, now)
    return most


def test_a_rolling_group_goes_out_with_one_slot_free_and_its_members_take_slots_as_they_free(
    tmp_path,
):
    at_once = engine_for(config(tmp_path / "a", **{"server.group_dispatch_at": 0}), tmp_path)
    at_once.scheduler.fill()
    # G = 5 of C = 6 train; one slot is free, and a group needs five at once.
    assert len(at_once.scheduler.in_flight) == 1
    two = engine_for(config(tmp_path / "2", **{"server.group_dispatch_at": 2}), tmp_path)
    two.scheduler.fill()
    assert len(two.scheduler.in_flight) == 1  # S = 2: one free slot is not enough

    engine = engine_for(config(tmp_path / "r"), tmp_path)
    scheduler = engine.scheduler
    assert isinstance(scheduler, BufferedScheduler)
    scheduler.fill()
    first, second = sorted(scheduler.in_flight.values(), key=lambda u: u.seq)
    # The first group's members start with its masked-input stage; the second's first
    # member (in client order) takes the free slot, the other four the first group's
    # four earliest free slots, each as it frees (none before its keys are agreed).
    begin = min(second.starts.values())
    assert len(set(first.starts.values())) == 1
    frees = sorted(first.frees.values())[: G - 1]
    assert [second.starts[c] for c in sorted(second.clients)] == [
        begin,
        *(max(begin, t) for t in frees),
    ]
    assert sorted(second.starts.values())[-1] > begin, "members start as slots come free"
    assert most_training_at_once([first, second]) <= C
    # Members waiting for a slot hold it (no third group), but do not count as training.
    assert scheduler.clients_in_flight() == 2 * G
    assert scheduler.clients_training() <= C


def test_rolling_groups_reach_the_same_updates_sooner_never_training_more_than_c(tmp_path):
    seen: dict[int, Dispatch] = {}
    rolling = engine_for(config(tmp_path / "r"), tmp_path / "r", seen)
    rolling.run()
    at_once = engine_for(config(tmp_path / "a", **{"server.group_dispatch_at": 0}), tmp_path)
    at_once.run()
    assert rolling.round == at_once.round == 6
    for record in rolling.history:  # each update one group's first R, the rest left out
        assert record.applied and record.cohort_aggregated == R
        assert record.extra["drops_by_reason"] == {"left out by design": G - R}
        assert record.extra["in_flight"] <= C
    assert len(seen) >= rolling.round
    assert most_training_at_once(list(seen.values())) <= C
    assert any(u.delays for u in seen.values()), "some member waited for a slot"
    done_rolling = rolling.history[-1].extra["sim_clock_s"]
    done_at_once = at_once.history[-1].extra["sim_clock_s"]
    assert done_rolling < done_at_once


def test_a_recomputed_rolling_group_leaves_out_the_same_members(tmp_path):
    engine = engine_for(config(tmp_path), tmp_path)
    scheduler = engine.scheduler
    assert isinstance(scheduler, BufferedScheduler)
    clients = (0, 1, 2, 3, 4)
    # Member 0 trains at once; the others' slots free 0.5 to 2 s later.
    ready = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0}
    unit = Dispatch(1, clients, 0, 0.0)
    scheduler.runner.run_group(unit, engine.weights, 0.0, ready)
    got = unit.outcome
    assert isinstance(got, Aggregate) and len(got.contributors) == R
    assert unit.delays and all(unit.starts[c] >= ready[c] for c in clients)
    # The checkpoint keeps the delays (never the update): recomputed, the same members
    # are released and the same are left out, whatever the slots are then.
    again = Dispatch.from_state(unit.to_state())
    assert again.delays == unit.delays
    scheduler.runner.run_group(again, engine.weights)
    assert isinstance(again.outcome, Aggregate)
    assert again.outcome.contributors == got.contributors
    assert all(again.outcome.dropped[c].startswith(LEFT_OUT) for c in got.dropped)
    # Without the delays the members would all start at once: another first R.
    alone = Dispatch(1, clients, 0, 0.0)
    scheduler.runner.run_group(alone, engine.weights, 0.0)
    assert isinstance(alone.outcome, Aggregate)
    assert alone.outcome.contributors != got.contributors


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"server.group_dispatch_at": 6}, "server.group_dispatch_at = 6: must be in [1, "),
        ({"server.group_dispatch_at": -1}, "server.group_dispatch_at = -1: must be >= 0"),
        ({"server.group_dispatch_at": float("nan")}, "server.group_dispatch_at = nan: must be"),
        ({"server.mode": "sync", "server.group_release_at": 0}, "server.group_dispatch_at = 1"),
        (
            {"secagg.enabled": False, "server.group_release_at": 0, "server.group_size": 1},
            "server.group_dispatch_at = 1 with secagg.enabled = false",
        ),
    ],
)
def test_a_rolling_dispatch_outside_async_secure_groups_is_refused(tmp_path, extra, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        config(tmp_path, **extra)


def test_a_rolling_dispatch_without_the_members_free_times_is_refused(tmp_path):
    # Without a latency model (or on the wall clock) when a member frees is not known.
    cfg = config(tmp_path, **{"simulation.latency_median": 0.0})
    with pytest.raises(ValueError, match=re.escape("server.group_dispatch_at = 1 needs")):
        engine_for(cfg, tmp_path)
