"""The availability model: who drops, who straggles, and the engine living with it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.transport import ClientFailure
from fedveil.simulations.availability import (
    DROPPED,
    LATE,
    AvailabilityModel,
    AvailabilityTransport,
    parse_stage_dropout,
)
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.simulate_run import simulate


def test_decisions_depend_only_on_seed_client_round_and_stage():
    m = AvailabilityModel(seed=3, dropout=0.3, spread=1.0)
    everyone = m.judge(5, "train", range(200), None).failed
    assert 20 < len(everyone) < 120
    # a client's fate does not depend on who else is asked, or in which order
    part = m.judge(5, "train", [199, 7, 150, 3], None).failed
    assert part == {c: r for c, r in everyone.items() if c in (199, 7, 150, 3)}
    assert m.judge(6, "train", range(200), None).failed != everyone
    assert m.judge(5, "masked_input", range(200), None).failed != everyone
    assert AvailabilityModel(seed=4, dropout=0.3).judge(5, "train", range(200), None).failed


def test_dropout_rate_matches_the_probability():
    m = AvailabilityModel(seed=0, dropout=0.2)
    dropped = sum(len(m.judge(r, "train", range(2000), None).failed) for r in range(10))
    assert dropped / 20_000 == pytest.approx(0.2, abs=0.01)


def test_spread_makes_some_clients_much_flakier_than_others():
    m = AvailabilityModel(seed=0, dropout=0.1, spread=2.0)
    p = m.dropout_probability("train", range(5000))
    assert np.median(p) == pytest.approx(0.1, abs=0.01)
    assert p.max() > 0.6 and p.min() < 0.01
    # and it persists: the flaky clients drop far more often, round after round
    flaky, steady = np.argsort(p)[-200:], np.argsort(p)[:200]
    rounds = [m.judge(r, "train", range(5000), None).failed for r in range(20)]
    rate = {
        name: np.mean([sum(int(c) in f for c in ids) / 200 for f in rounds])
        for name, ids in (("flaky", flaky), ("steady", steady))
    }
    assert rate["flaky"] > 10 * rate["steady"]


def test_stage_overrides_and_their_errors():
    assert parse_stage_dropout("train=0.1, evaluate=0") == {"train": 0.1, "evaluate": 0.0}
    m = AvailabilityModel(seed=0, dropout=0.5, stage_dropout={"evaluate": 0.0})
    assert not m.judge(1, "evaluate", range(100), None).failed
    assert m.judge(1, "train", range(100), None).failed
    for bad, fragment in [
        ("train", "expected STAGE=PROBABILITY"),
        ("train=lots", "'lots' is not a number"),
        ("train=1.5", "must be in [0, 0.99]"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(None, {"simulation.dropout_stages": bad})
        assert str(err.value).startswith("simulation.dropout_stages: ")
        assert fragment in str(err.value)


def test_stragglers_miss_the_deadline_and_set_the_simulated_time():
    m = AvailabilityModel(seed=1, latency_median=2.0, latency_sigma=1.0, latency_client_sigma=0)
    lat = m.latency(1, "train", range(1000))
    assert np.median(lat) == pytest.approx(2.0, rel=0.15)
    verdict = m.judge(1, "train", range(1000), timeout_s=4.0)
    late = {c for c, r in verdict.failed.items() if r.startswith(LATE)}
    assert late == {c for c in range(1000) if lat[c] > 4.0}
    assert 100 < len(late) < 400
    assert verdict.simulated_time(4.0) == 4.0
    assert not m.judge(1, "train", range(1000), timeout_s=None).failed
    on_time = m.judge(1, "train", range(1000), None)
    assert on_time.simulated_time(None) == pytest.approx(lat.max())


def test_a_lost_client_stays_lost_for_the_rest_of_its_round():
    cfg = load_config(
        None, {"model.task": "tiny_task:make", "data.num_clients": 12, "server.per_round": 4}
    )
    task = tiny_task.make(cfg)
    model = AvailabilityModel(seed=0, dropout=0.4)
    transport = AvailabilityTransport(InProcessTransport(task), model)
    hello = Envelope("hello", 1)
    first = transport.exchange(dict.fromkeys(range(12), hello), None)
    lost = {c for c, r in first.items() if isinstance(r, ClientFailure)}
    assert lost and all(DROPPED in first[c].reason for c in lost)
    later = transport.exchange({c: Envelope("evaluate_like", 1) for c in range(12)}, None)
    assert all(
        isinstance(later[c], ClientFailure) and "gone since" in later[c].reason for c in lost
    )
    report = transport.round_report(1)
    assert report["sim_dropouts"] >= len(lost) and "sim_time_s" not in report
    fresh = transport.exchange(dict.fromkeys(range(12), Envelope("hello", 2)), None)
    assert not any(
        "gone since" in r.reason for r in fresh.values() if isinstance(r, ClientFailure)
    ), "a new round starts with everyone back"
    transport.close()


def test_simulated_dropouts_and_stragglers_reach_the_metrics(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 10,
            "server.rounds": 4,
            "server.round_timeout": 3.0,
            "simulation.dropout": 0.2,
            "simulation.latency_median": 1.0,
            "simulation.latency_sigma": 1.0,
            "simulation.workers": 1,  # in process (fast tier): same result as workers
            "out": str(tmp_path / "run"),
        },
    )
    summary = simulate(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert summary["rounds"] == 4
    for row in rows:
        assert row["dropped"] == row["sim_dropouts"] + row["sim_stragglers"]
        assert row["cohort_aggregated"] + row["dropped"] == row["cohort_planned"]
        assert 0 < row["sim_time_s"] <= 3.0  # one exchange per round, never past its deadline
    assert sum(r["sim_dropouts"] for r in rows) > 0
    assert sum(r["sim_stragglers"] for r in rows) > 0
