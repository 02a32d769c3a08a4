"""[drift] settings are checked like the rest of server.toml, and the drift monitor refuses a
version trained under DP (its evaluation would be an unaccounted release) without
submitting anything, saying why in the operator's drift state."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedveil.config import ConfigError, load_config
from fedveil.server.coordinator.drift import DriftMonitor, dp_refusal
from fedveil.server.coordinator.runs import RunManager
from fedveil.server.coordinator.settings import settings_from_dict
from fedveil.server.registry import Registry
from fedveil.simulations.run import simulate


@pytest.mark.parametrize(
    ("drift", "field"),
    [
        ({"enabled": True}, "drift.model"),
        ({"threshold": 1.5}, "drift.threshold"),
        ({"interval_s": 1}, "drift.interval_s"),
        ({"clients": 0}, "drift.clients"),
        ({"every": 5}, "drift.every"),
    ],
)
def test_bad_drift_settings_name_the_field(tmp_path: Path, drift: dict, field: str) -> None:
    raw = {"tls": {"insecure": True}, "drift": drift}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        settings_from_dict(raw, tmp_path)


def test_drift_of_a_dp_version_is_refused_and_nothing_runs(tmp_path: Path) -> None:
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
    }
    simulate(load_config(None, overrides))
    raw = {
        "state_dir": "state",
        "tls": {"insecure": True},
        "drift": {"enabled": True, "model": "tiny-blobs", "interval_s": 10},
    }
    settings = settings_from_dict(raw, tmp_path)
    registry = Registry(settings.state_dir / "registry")
    version = registry.register(run)
    registry.promote(version.name, version.version)
    # No SuperLink: a submission would fail loudly, and none may happen.
    manager = RunManager(settings, link=None)
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager)
    monitor.tick()
    state = monitor.state()
    assert "dp.mechanism = 'central'" in state["refused"]
    assert "charged to the budget" in state["refused"]
    assert state.get("pending") is None and state["history"] == []
    assert manager.run_ids() == []


def test_local_dp_sgd_counts_as_dp() -> None:
    assert dp_refusal({"client": {"dp_sgd_noise": 1.1}}) is not None
    assert dp_refusal({"dp": {"mechanism": "none"}, "client": {"dp_sgd_noise": 0.0}}) is None
