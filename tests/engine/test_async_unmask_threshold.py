"""A secure-aggregation group's unmask stage ended at its first t replies
(server.group_unmask = 'threshold'): every member holds a share of every secret to
reconstruct (the groups' neighbour graph is complete), so t replies reconstruct the
same sum as the survivors' every reply, and the group arrives without waiting for its
slowest survivor's shares. The session (members, keys, t, release at R) is the same;
the server receives fewer shares, never more. Simulated clock, tiny task, in process."""

from __future__ import annotations

import re

import pytest
import torch

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
        "server.group_dispatch_at": 3,
        "server.group_member_model": "start",
        "server.group_unmask": "threshold",
        "server.rounds": 6,
        "secagg.enabled": True,
        "secagg.dropout_rate": 0.4,  # covers the G - R = 2 members left out by design
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "simulation.latency_client_sigma": 0.5,
        # An unmask reply as slow as a training: the stage's wait is plain to see.
        "simulation.message_latency_share": 1.0,
        "out": str(tmp_path),
    }
    values.update(extra)
    return load_config(None, values)


def engine_for(cfg, tmp_path) -> RoundEngine:
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    scheduler = BufferedScheduler(cfg, availability=AvailabilityModel.from_config(cfg))
    return RoundEngine(cfg, task, InProcessTransport(task), channel=channel, scheduler=scheduler)


def test_a_group_unmasked_at_its_first_t_replies_releases_the_same_sum_sooner(tmp_path):
    survivors = engine_for(config(tmp_path / "s", **{"server.group_unmask": "survivors"}),
                           tmp_path / "s")  # fmt: skip
    threshold = engine_for(config(tmp_path / "t"), tmp_path / "t")
    clients = (0, 1, 2, 3, 4)
    sooner = 0
    for seq in range(1, 9):
        got = {}
        for name, engine in (("survivors", survivors), ("threshold", threshold)):
            runner = engine.scheduler.runner
            keys, _ = runner.agree_keys(seq, clients)
            unit = Dispatch(seq, clients, 0, 0.0)
            elapsed = runner.run_keyed_group(unit, engine.weights, keys, 0.0)
            got[name] = (unit, elapsed)
        (slow, slow_s), (fast, fast_s) = got["survivors"], got["threshold"]
        a, b = slow.outcome, fast.outcome
        assert isinstance(a, Aggregate) and isinstance(b, Aggregate)
        # The same members released (the first R masked inputs), the same sum: equal up
        # to the quantiser's stochastic rounding, drawn afresh per session (a mask left
        # on the sum would be noise the size of the modulus).
        assert a.contributors == b.contributors and len(b.contributors) == R
        encoding = engine.channel.encoding  # each summand within a step x its weight scale
        bound = 2 * R * encoding.quantizer(G).step * encoding.max_weight
        assert torch.allclose(a.total, b.total, rtol=0, atol=bound)
        assert a.weight == b.weight
        # A survivor whose shares were not waited for is in the sum, not a dropped client;
        # members free at their masked input either way.
        assert set(b.dropped) == set(a.dropped) == set(clients) - set(b.contributors)
        assert fast.frees == slow.frees
        assert fast_s <= slow_s
        sooner += fast_s < slow_s
    assert sooner > 0, "the unmask stage ended before the slowest survivor's shares"


def test_the_unmask_timed_at_dispatch_is_the_unmask_run_at_arrival(tmp_path):
    """Late members: a group's session is timed ahead (no message sent) and run whole at
    its arrival; with the unmask at t both give the same duration."""
    engine = engine_for(config(tmp_path), tmp_path)
    runner = engine.scheduler.runner
    clients = (0, 1, 2, 3, 4)
    for seq in range(1, 6):
        live, _ = runner.time_keys(seq, clients)
        assert live == clients
        timed = Dispatch(seq, clients, 0, 0.0)
        elapsed = runner.time_keyed_group(timed, live, 0.0, dict.fromkeys(clients, 0.0))
        keys, _ = runner.agree_keys(seq, clients)
        ran = Dispatch(seq, clients, 0, 0.0)
        assert runner.run_keyed_group(ran, engine.weights, keys, 0.0) == elapsed


def test_a_run_unmasked_at_t_applies_every_group_sooner_with_nothing_counted_dropped(tmp_path):
    slow = engine_for(config(tmp_path / "s", **{"server.group_unmask": "survivors"}),
                      tmp_path / "s")  # fmt: skip
    slow.run()
    fast = engine_for(config(tmp_path / "t"), tmp_path / "t")
    fast.run()
    assert fast.round == slow.round == 6
    for record in fast.history:
        assert record.applied and record.cohort_aggregated == R
        # Only the members left out of the masked input by design are drops.
        assert record.extra["drops_by_reason"] == {LEFT_OUT: G - R}
    done_fast = fast.history[-1].extra["sim_clock_s"]
    done_slow = slow.history[-1].extra["sim_clock_s"]
    assert done_fast < done_slow
    tau = [t for r in fast.history for t in r.extra["staleness"]]
    tau_slow = [t for r in slow.history for t in r.extra["staleness"]]
    assert sum(tau) <= sum(tau_slow)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"server.group_unmask": "first"}, "server.group_unmask = 'first'"),
        (
            {"server.mode": "sync", "server.group_release_at": 0, "server.group_dispatch_at": 0,
             "server.group_member_model": "dispatch"},
            "server.group_unmask = 'threshold' with server.mode = 'sync'",
        ),
        (
            {"secagg.enabled": False, "server.group_release_at": 0, "server.group_size": 1,
             "server.group_dispatch_at": 0, "server.group_member_model": "dispatch"},
            "server.group_unmask = 'threshold': needs secagg.enabled = true",
        ),
        (
            {"secagg.threat": "malicious", "server.group_member_model": "dispatch"},
            "server.group_unmask = 'threshold': refused with secagg.threat = 'malicious'",
        ),
    ],
)  # fmt: skip
def test_an_unmask_at_t_where_t_replies_may_not_suffice_is_refused(tmp_path, extra, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        config(tmp_path, **extra)


def test_an_unmask_at_t_without_a_complete_neighbour_graph_is_refused(tmp_path):
    # With 4 neighbours of 5 others, t replies may hold fewer than t shares of a secret.
    extra = {"server.group_size": 6, "server.group_release_at": 4,
             "secagg.dropout_rate": 0.34, "secagg.neighbors": 4}  # fmt: skip
    cfg = config(tmp_path, **extra)
    with pytest.raises(ValueError, match=re.escape("server.group_unmask = 'threshold': a group")):
        engine_for(cfg, tmp_path)
