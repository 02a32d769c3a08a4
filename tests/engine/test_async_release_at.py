"""An asynchronous secure-aggregation group released at its first R of G members
(server.group_release_at): the masked-input stage ends at the R-th reply on the simulated
clock, the other members are dropped by design and their pairwise masks removed by the
protocol's dropout recovery, so the sum is exactly the first R members' sum. A left-out
member's masked input, sent later, is refused by the session, its stage closed
(tests/privacy/secagg/test_secagg_late_masked_input.py), and by the device transport
(tests/coordinator/test_deploy_transport_concurrent.py). Distributed DP sizes the noise
shares for the R released members; the config refuses what would break the group's
threat model, naming the field."""

from __future__ import annotations

import re

import pytest
import torch

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.protocol.kinds import TRAINING_STAGE, Kind
from fedveil.server.engine.aggregation import Aggregate
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.dispatches import Dispatch
from fedveil.server.engine.dp_from_config import plan_distributed_dp
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import LEFT_OUT
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport

G, R = 5, 3
GROUP = (0, 1, 2, 3, 4)


def config(tmp_path, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.mode": "async",
        "server.per_round": 6,
        "server.concurrency": 6,
        "server.buffer": 3,
        "server.group_size": G,
        "server.group_release_at": R,
        "server.rounds": 3,
        "secagg.enabled": True,
        "secagg.dropout_rate": 0.4,  # covers the G - R = 2 members left out by design
        # Distinct latencies per member: the first R are well defined.
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "simulation.latency_client_sigma": 0.5,
        "out": str(tmp_path),
    }
    values.update(extra)
    return load_config(None, values)


def engine_for(cfg, tmp_path) -> tuple[RoundEngine, AvailabilityModel]:
    task = tiny_task.make(cfg)
    privacy, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    availability = AvailabilityModel.from_config(cfg)
    assert availability is not None
    scheduler = BufferedScheduler(cfg, availability=availability)
    transport = InProcessTransport(task, run_config=cfg)  # the clients hold the run config
    engine = RoundEngine(
        cfg, task, transport, channel=channel, scheduler=scheduler, privacy=privacy
    )
    return engine, availability


def run_group(engine: RoundEngine, clients: tuple[int, ...]) -> tuple[Dispatch, float]:
    """Dispatch 1 of `clients` on the initial model: its outcome and simulated duration."""
    scheduler = engine.scheduler
    assert isinstance(scheduler, BufferedScheduler)
    unit = Dispatch(1, clients, 0, 0.0)
    elapsed = scheduler.runner.run_group(unit, engine.weights, 0.0)
    return unit, elapsed


def test_a_group_releases_at_its_first_r_with_the_others_masks_removed_and_the_sum_exact(
    tmp_path,
):
    engine, availability = engine_for(config(tmp_path / "r"), tmp_path / "r")
    unit, elapsed = run_group(engine, GROUP)
    got = unit.outcome
    assert isinstance(got, Aggregate)
    # The first R masked inputs in simulated time, and no more, are in the sum.
    kind = Kind.secagg(TRAINING_STAGE).value
    latency = dict(zip(GROUP, availability.latency(1, kind, list(GROUP)), strict=True))
    first = sorted(GROUP, key=lambda c: (latency[c], c))[:R]
    assert got.contributors == sorted(first)
    left_out = set(GROUP) - set(first)
    assert set(got.dropped) == left_out
    assert all(got.dropped[c].startswith(LEFT_OUT) for c in left_out)
    # The left-out members stop at the release; the group does not wait for them.
    release = min(unit.frees[c] for c in left_out)
    assert all(unit.frees[c] == release for c in left_out)
    assert all(unit.frees[c] <= release for c in first)

    # The same first R run as a group of their own (same dispatch, model and training):
    # the same sum but for the stochastic rounding of each weighted update (the quantizer
    # depends on the group size): at most a step 2r/(L-1) per example weight (<= 60 in the
    # tiny task), each way. A pairwise mask of a left-out member left in the sum would be
    # uniform over the modulus, a left-out update would add O(1).
    alone, _ = engine_for(
        config(tmp_path / "alone", **{"server.group_size": R, "server.group_release_at": 0}),
        tmp_path / "alone",
    )
    ref, _ = run_group(alone, tuple(first))
    assert isinstance(ref.outcome, Aggregate) and ref.outcome.contributors == sorted(first)
    step = 2 * engine.cfg.secagg.clip_range / (engine.cfg.secagg.levels - 1)
    assert torch.allclose(got.total, ref.outcome.total, rtol=0, atol=2 * R * 60 * step)
    assert got.weight == ref.outcome.weight

    # Without the release the group waits for its slowest member, and sums all five.
    whole, _ = engine_for(config(tmp_path / "g", **{"server.group_release_at": 0}), tmp_path / "g")
    slow, slow_elapsed = run_group(whole, GROUP)
    assert isinstance(slow.outcome, Aggregate) and slow.outcome.contributors == list(GROUP)
    assert elapsed < slow_elapsed
    assert (got.total - slow.outcome.total).abs().max() > 100 * R * 60 * step


@pytest.mark.parametrize("latency", [1.0, 0.0], ids=["latency_model", "no_latency_model"])
def test_an_async_run_with_groups_released_at_r_applies_r_updates_per_group(tmp_path, latency):
    cfg = config(tmp_path, **{"simulation.latency_median": latency})
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    scheduler = BufferedScheduler(cfg, availability=AvailabilityModel.from_config(cfg))
    engine = RoundEngine(cfg, task, InProcessTransport(task), channel=channel, scheduler=scheduler)
    engine.run()
    assert engine.round == 3
    for record in engine.history:
        assert record.applied and record.cohort_aggregated == R  # buffer K = R: one group
        assert record.extra["drops_by_reason"] == {"left out by design": G - R}


DISTRIBUTED = {
    "dp.mechanism": "distributed",
    "dp.epsilon": 8.0,
    "dp.clip_norm": 0.5,
    "server.max_participations": 2,
    "server.group_size": 6,
    "secagg.dropout_rate": 0.5,  # covers G - R = 3
}


def test_under_distributed_dp_noise_shares_are_sized_for_the_released_members(tmp_path):
    cfg = config(tmp_path, **DISTRIBUTED)
    size = sum(p.numel() for p in tiny_task.make(cfg).model_fn().parameters())
    plan = plan_distributed_dp(cfg, size, 12)
    # At most R members' shares reach a released sum: the plan's survivor floor (which
    # every member holds) is R, its honest shares R less the corrupt ones; a plan sized
    # for the whole group would refuse every release at R at the unmask gate.
    assert plan.min_survivors == R and plan.min_honest == R - plan.corrupt >= 1
    whole = {**DISTRIBUTED, "server.group_release_at": 0, "secagg.dropout_rate": 0.1}
    whole_plan = plan_distributed_dp(config(tmp_path, **whole), size, 12)
    assert whole_plan.min_survivors == 5 and whole_plan.min_honest == 5 - whole_plan.corrupt


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"server.group_release_at": 2}, "server.group_release_at = 2"),
        ({"server.group_release_at": 6}, "server.group_release_at = 6"),
        ({"secagg.dropout_rate": 0.1}, "secagg.dropout_rate = 0.1"),
        ({"server.buffer": 4}, "server.group_release_at = 3: below server.buffer = 4"),
        ({"secagg.enabled": False}, "server.group_release_at = 3 with secagg.enabled"),
        ({"server.mode": "sync"}, "server.group_release_at = 3 with server.mode"),
        ({"server.group_release_at": float("nan")}, "server.group_release_at"),
        # A threshold above R: the threat model admits none once its dropouts cover G - R.
        ({"secagg.threshold": 4}, "secagg.threshold = 4"),
    ],
)
def test_what_breaks_the_groups_threat_model_is_refused_naming_the_field(tmp_path, extra, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        cfg = config(tmp_path, **extra)  # the threshold is checked with the threat model
        make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "ledger.jsonl")
