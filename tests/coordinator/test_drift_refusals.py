"""[drift] settings are checked like the rest of server.toml, and the drift monitor refuses
a DP version's evaluation that secure aggregation cannot run (too few devices connected for
its threshold), and any evaluation of a version trained with distributed DP or DP-SGD
(each a guarantee against the coordinator, whose own noise is all an evaluation has), without
submitting anything, saying why in the drift state; an evaluation whose run never released
anything is refunded to the version's budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedveil.config import ConfigError, load_config
from fedveil.server.coordinator.drift import DriftMonitor, trained_with_dp
from fedveil.server.coordinator.runs import RunManager
from fedveil.server.coordinator.settings import ServerSettings, settings_from_dict
from fedveil.server.registry import ModelVersion, Registry
from fedveil.simulations.simulate_run import simulate


@pytest.mark.parametrize(
    ("drift", "field"),
    [
        ({"enabled": True}, "drift.model"),
        ({"threshold": 1.5}, "drift.threshold"),
        ({"interval_s": 1}, "drift.interval_s"),
        ({"clients": 0}, "drift.clients"),
        ({"every": 5}, "drift.every"),
        ({"epsilon": 0.0}, "drift.epsilon = 0.0: must be > 0"),
        ({"epsilon": 500.0}, "drift.epsilon = 500.0: must be <= 100"),
        ({"delta": 0.01}, "drift.delta = 0.01: must be <= 0.001"),
        ({"budget": -1.0}, "drift.budget = -1.0: must be > 0"),
        ({"epsilon": 2.0, "budget": 1.0}, "drift.budget = 1: must be >= drift.epsilon = 2"),
        ({"loss_cap": 0.0}, "drift.loss_cap = 0.0: must be > 0"),
    ],
)
def test_bad_drift_settings_name_the_field(tmp_path: Path, drift: dict, field: str) -> None:
    raw = {"tls": {"insecure": True}, "drift": drift}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        settings_from_dict(raw, tmp_path)


def dp_version(
    tmp_path: Path, drift: dict, **training: object
) -> tuple[ServerSettings, ModelVersion]:
    """Settings with [drift] and a promoted version trained with central DP (or with the
    `training` overrides)."""
    run = tmp_path / "dp-run"
    overrides = {
        "model.task": "tiny_task:make",
        "data.num_clients": 6,
        "server.per_round": 3,
        "server.rounds": 1,
        "simulation.workers": 1,
        "dp.mechanism": "central",
        "dp.epsilon": 8.0,
        "out": str(run),
    } | training
    simulate(load_config(None, overrides))
    raw = {
        "state_dir": "state",
        "tls": {"insecure": True},
        "runs": {"allowed_tasks": ["tiny_task:make"]},
        "drift": {"enabled": True, "model": "tiny-blobs", "interval_s": 10} | drift,
    }
    settings = settings_from_dict(raw, tmp_path)
    registry = Registry(settings.state_dir / "registry")
    version = registry.register(run)
    registry.promote(version.name, version.version)
    return settings, version


def test_too_few_devices_for_the_threshold_refuses_a_dp_evaluation(tmp_path: Path) -> None:
    settings, _ = dp_version(tmp_path, {"clients": 5})
    # No SuperLink: a submission would fail loudly, and none may happen.
    manager = RunManager(settings, link=None)
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 2)
    monitor.tick()
    state = monitor.state()
    assert "2 devices would evaluate (drift.clients = 5, 2 connected)" in state["refused"]
    assert "secure aggregation's threshold" in state["refused"]
    assert "needs at least 3; nothing is sent to the devices" in state["refused"]
    assert state.get("pending") is None and state["history"] == []
    assert not state.get("charges") and manager.run_ids() == []


def test_a_distributed_dp_version_is_not_evaluated(tmp_path: Path) -> None:
    # Its epsilon holds against the coordinator, whose own noise is all an evaluation has:
    # refused with the reason in the drift state (GET /drift, the dashboard), nothing sent.
    distributed = {"dp.mechanism": "distributed", "secagg.enabled": True, "server.per_round": 6}
    settings, version = dp_version(tmp_path, {"clients": 6}, **distributed)
    manager = RunManager(settings, link=None)  # a submission would fail loudly
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6)
    monitor.tick()
    state = monitor.state()
    refused = state["refused"]
    assert refused.startswith(f"drift evaluation of {version.ref} refused")
    assert "dp.mechanism = 'distributed'" in refused and "exact sums" in refused
    assert "nothing is sent to the devices" in refused
    assert state.get("pending") is None and state["history"] == []
    assert not state.get("charges") and manager.run_ids() == []


def test_a_dp_sgd_version_is_not_evaluated(tmp_path: Path) -> None:
    # DP-SGD's example-level epsilon is the devices' own, against the coordinator too; a
    # drift evaluation has only the coordinator's noise: refused like distributed DP.
    dp_sgd = {"dp.mechanism": "none", "client.dp_sgd_noise": 1.0, "client.dp_sgd_clip": 1.0}
    settings, version = dp_version(tmp_path, {"clients": 3}, **dp_sgd)
    manager = RunManager(settings, link=None)  # a submission would fail loudly
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6)
    monitor.tick()
    state = monitor.state()
    refused = state["refused"]
    assert refused.startswith(f"drift evaluation of {version.ref} refused")
    assert "client.dp_sgd_noise = 1.0" in refused and "exact sums" in refused
    assert "Nothing is sent to the devices" in refused
    assert state.get("pending") is None and state["history"] == []
    assert not state.get("charges") and manager.run_ids() == []


def test_a_dp_evaluation_is_reserved_then_refunded_when_nothing_was_released(tmp_path):
    settings, version = dp_version(tmp_path, {"clients": 3, "epsilon": 1.0, "budget": 3.0})
    clock = [1000.0]
    manager = RunManager(settings, link=None)  # the run is created, then fails to start
    monitor = DriftMonitor(
        settings.drift, settings.state_dir, manager, clock=lambda: clock[0], connected=lambda: 4
    )
    monitor.tick()
    state = monitor.state()
    assert state["refused"] is None and state["pending"]["dp"] is True
    (run_id,) = manager.run_ids()
    (charge,) = state["charges"][version.ref]
    assert charge["run_id"] == run_id and charge["status"] == "reserved"
    # The evaluation's run: one secure-aggregation session of 3 devices, nothing trained;
    # its DP (the plan, the charges before it, the budget) in drift.json, not in [dp].
    rd = settings.state_dir / "runs" / run_id
    spec = json.loads((rd / "drift.json").read_text())
    assert spec["dp"]["budget"] == 3.0 and spec["dp"]["prior"] == []
    assert spec["dp"]["plan"]["epsilon"] == 1.0 and spec["dp"]["plan"]["noise_multiplier"] > 0
    config = (rd / "config.toml").read_text()
    assert 'mechanism = "none"' in config and "per_round = 3" in config
    assert json.loads((rd / "deploy.json").read_text())["wait_for_clients"] == 3

    clock[0] += 1  # the run failed without a ledger: nothing unmasked, nothing charged
    monitor.tick()
    state = monitor.state()
    (entry,) = state["history"]
    assert entry["dp"] is True and entry["charge"] == "refunded" and entry["epsilon"] == 0.0
    assert entry["epsilon_spent"] == 0.0 and entry["budget_left"] == 3.0 and "error" in entry
    assert state["charges"][version.ref][0]["status"] == "refunded"
    assert not {"clients_asked", "clients_answered"} & set(entry)


def test_what_makes_a_version_dp() -> None:
    assert trained_with_dp({"client": {"dp_sgd_noise": 1.1}}) == "client.dp_sgd_noise = 1.1"
    assert trained_with_dp({"dp": {"mechanism": "central"}}) == "dp.mechanism = 'central'"
    assert trained_with_dp({"dp": {"mechanism": "none"}, "client": {"dp_sgd_noise": 0.0}}) is None
