"""Late members of a rolling group train on the model current at their own start
(server.group_member_model = 'start'): a group goes out with S of its G members, and
each of the others downloads, when its slot comes free, whatever version the server
holds then. The session is the one fixed when the group formed (its members, keys,
threshold, release at R); the released sum is of deltas, each against its member's
own model, weighted by the staleness of the oldest. Timed at formation and dispatch,
the session runs whole at the group's arrival, and the timing is the real session's."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
import torch

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.dispatches import Dispatch
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
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
        "server.group_dispatch_at": 1,  # out with one slot free: most members start late
        "server.group_member_model": "start",
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


class ModelsSeen:
    """The model each client's masked-input request carried, by dispatch (the transport
    the clients' requests really go through)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.models: dict[tuple[int, int], torch.Tensor] = {}

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        for cid, env in requests.items():
            if env.kind == Kind.secagg("masked_input"):
                self.models[(env.round, cid)] = env.arrays[F.MODEL].clone()
        return self.inner.exchange(requests, timeout_s, on_reply=on_reply)

    def close(self) -> None:
        self.inner.close()


def engine_for(
    cfg, tmp_path, seen: dict[int, Dispatch], models: dict[int, torch.Tensor] | None = None
) -> tuple[RoundEngine, ModelsSeen]:
    """The engine; `seen` collects every unit in flight after each update (computed
    when it arrives), `models` each version's weights."""
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    scheduler = BufferedScheduler(cfg, availability=AvailabilityModel.from_config(cfg))
    transport = ModelsSeen(InProcessTransport(task))
    engine: RoundEngine

    def watch(record) -> None:
        seen.update(scheduler.in_flight)
        if models is not None:
            models[record.round] = engine.weights.clone()

    engine = RoundEngine(cfg, task, transport, channel=channel, scheduler=scheduler, on_round=watch)
    if models is not None:
        models[0] = engine.weights.clone()
    return engine, transport


def test_late_members_train_on_the_version_current_at_their_start_weighted_as_the_oldest(
    tmp_path,
):
    seen: dict[int, Dispatch] = {}
    models: dict[int, torch.Tensor] = {}
    engine, transport = engine_for(config(tmp_path), tmp_path, seen, models)
    engine.run()
    assert engine.round == 6
    applied_at = {0: 0.0, **{r.round: r.extra["sim_clock_s"] for r in engine.history}}
    units = {u.seq: u for u in seen.values() if u.computed}
    late = 0
    for record in engine.history:
        assert record.applied and record.cohort_aggregated == R
        (seq,) = record.extra["applied_dispatches"]
        unit = units.get(seq)
        if unit is None:  # arrived before any update was recorded: not watched
            continue
        got = unit.outcome
        assert isinstance(got, Aggregate)
        for c in got.contributors:
            start = unit.starts[c]
            # The version current at the member's start: the newest applied by then (the
            # group's own for a member that started with it).
            want = unit.version
            if start > unit.dispatched_at:
                want = max(v for v, t in applied_at.items() if t <= start and v >= unit.version)
            assert unit.bases[c] == want
            assert torch.equal(transport.models[(seq, c)], models[want]), "it trained on it"
            late += unit.bases[c] > unit.version
        # The sum is weighted as stale as its oldest member's model; each member's own
        # staleness is on the record too.
        oldest = min(unit.bases[c] for c in got.contributors)
        assert record.extra["staleness"] == [record.round - 1 - oldest] * R
        assert sorted(record.extra["member_staleness"]) == sorted(
            record.round - 1 - unit.bases[c] for c in got.contributors
        )
    assert late > 0, "some member trained on a version newer than its group's"


def test_the_session_timed_at_dispatch_is_the_session_run_at_arrival(tmp_path):
    """Timed ahead (no message reaches a client), a group's key stages, masked input
    and unmask give the durations, free times and left-out members that the same
    group's session gives when run: here the default design's, keys agreed at once."""
    seen: dict[int, Dispatch] = {}
    cfg = config(tmp_path, **{"server.group_member_model": "dispatch"})
    engine, transport = engine_for(cfg, tmp_path, seen)
    runner = engine.scheduler.runner
    clients = (0, 1, 2, 3, 4)
    ready = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0}
    live, keys_s = runner.time_keys(7, clients)
    assert live == clients
    timed = Dispatch(7, clients, 0, 0.0)
    elapsed = runner.time_keyed_group(timed, live, 0.0, ready)
    assert not transport.models, "timing sends nothing"
    keys, agreed_s = runner.agree_keys(7, clients)
    assert agreed_s == keys_s
    ran = Dispatch(7, clients, 0, 0.0)
    assert runner.run_keyed_group(ran, engine.weights, keys, 0.0, ready) == elapsed
    assert (ran.frees, ran.starts, ran.delays) == (timed.frees, timed.starts, timed.delays)
    assert isinstance(ran.outcome, Aggregate) and len(ran.outcome.contributors) == R
    # Run whole at arrival with the timed delays: the same members are released.
    late = Dispatch.from_state(timed.to_state())
    runner.run_late_group(late, {0: engine.weights}.__getitem__, dict.fromkeys(clients, 0))
    assert isinstance(late.outcome, Aggregate)
    assert late.outcome.contributors == ran.outcome.contributors


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"server.group_member_model": "later"}, "server.group_member_model = 'later'"),
        ({"server.group_dispatch_at": 0}, "needs rolling dispatch, server.group_dispatch_at in"),
        ({"server.group_dispatch_at": G}, "(now 5)"),
        (
            {"server.mode": "sync", "server.group_release_at": 0, "server.group_dispatch_at": 0},
            "server.group_member_model = 'start' with server.mode = 'sync'",
        ),
        (
            {"dp.mechanism": "central", "dp.epsilon": 8.0,
             "server.max_participations": 20},
            "refused with dp.mechanism = 'central'",
        ),
        ({"secagg.threat": "malicious"}, "refused with secagg.threat = 'malicious'"),
    ],
)  # fmt: skip
def test_late_members_where_they_cannot_apply_are_refused_naming_the_field(tmp_path, extra, field):
    with pytest.raises(ConfigError, match=re.escape(field)) as err:
        config(tmp_path, **extra)
    assert "server.group_member_model" in str(err.value)


def test_in_the_clear_late_members_are_refused(tmp_path):
    extra = {
        "secagg.enabled": False,
        "server.group_release_at": 0,
        "server.group_dispatch_at": 0,
        "server.group_size": 1,
    }
    with pytest.raises(ConfigError, match=re.escape("needs secagg.enabled = true")):
        config(tmp_path, **extra)


def starts_by_id(units: list[Dispatch]) -> list[tuple[list[int], list[int]]]:
    """Per rolling group that had members wait for a slot: (ids that started with the
    group, ids that started later)."""
    out = []
    for u in units:
        first = min(u.starts.values())
        late = sorted(c for c in u.clients if u.starts[c] > first)
        if late:
            out.append((sorted(c for c in u.clients if c not in late), late))
    return out


def test_random_start_order_lets_any_member_start_late_not_the_highest_ids(tmp_path):
    """By client id the highest ids of every group start last (and are the ones a release
    at R leaves out); server.group_start_order = 'random' draws the order per dispatch."""
    by_id: dict[int, Dispatch] = {}
    engine, _ = engine_for(config(tmp_path / "i"), tmp_path / "i", by_id)
    engine.run()
    groups = starts_by_id(list(by_id.values()))
    assert groups and all(max(on_time) < min(late) for on_time, late in groups)

    drawn: dict[int, Dispatch] = {}
    cfg = config(tmp_path / "r", **{"server.group_start_order": "random"})
    engine, _ = engine_for(cfg, tmp_path / "r", drawn)
    engine.run()
    assert engine.round == 6
    groups = starts_by_id(list(drawn.values()))
    assert any(max(on_time) > min(late) for on_time, late in groups)
    # Drawn from the run seed: the same config, the same starts.
    again: dict[int, Dispatch] = {}
    engine, _ = engine_for(config(tmp_path / "a", **{"server.group_start_order": "random"}),
                           tmp_path / "a", again)  # fmt: skip
    engine.run()
    assert {s: u.starts for s, u in again.items()} == {s: u.starts for s, u in drawn.items()}


def test_a_start_order_without_rolling_dispatch_is_refused(tmp_path):
    extra = {"server.group_start_order": "random", "server.group_dispatch_at": 0,
             "server.group_member_model": "dispatch"}  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape("server.group_start_order = 'random': needs")):
        config(tmp_path, **extra)
