"""Drift evaluations are accounted per enrolled device across every version (issue 28,
"The drift budget is per version"): three versions evaluated 7 times each stay within a
per-version budget of 3.0 (2.87 each), but the same devices answered all 21, which
compose to 5.31; registering the same model again started a fresh budget. The device
budget (drift.device_budget) caps that composition, and GET /drift states it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedveil.config import ConfigError
from fedveil.privacy.dp.evaluation import composed_epsilon
from fedveil.server.coordinator.drift import DriftMonitor, evaluation_plan
from fedveil.server.coordinator.drift_devices import device_cap, most_charged_device
from fedveil.server.coordinator.runs import RunManager
from fedveil.server.coordinator.settings import settings_from_dict
from fedveil.server.registry import Registry
from tests.coordinator.test_drift_refusals import dp_version

DELTA = 1e-6
PLAN = evaluation_plan(1.0, DELTA, 5.0)
DEVICES = list(range(6))


def charge(run: str, devices: list[int] | None = DEVICES) -> dict:
    """A kept evaluation charge as drift_budget.DriftBudget.settle leaves it."""
    return {
        "run_id": run,
        "status": "charged",
        "at": 1.0,
        "noise_multiplier": PLAN.noise_multiplier,
        "epsilon": PLAN.epsilon,
        "delta": DELTA,
        "devices": devices,
    }


def seven_each(refs: list[str]) -> dict[str, list[dict]]:
    return {ref: [charge(f"{ref}-{i}") for i in range(7)] for ref in refs}


def test_the_issues_figures_compose_per_device_across_versions() -> None:
    charges = [c for per in seven_each(["m@1", "m@2", "m@3"]).values() for c in per]
    seven = composed_epsilon([PLAN.event()] * 7, DELTA)
    assert seven == pytest.approx(2.87, abs=0.005)  # each version within a budget of 3.0
    worst = most_charged_device(charges, DELTA)
    assert worst.evaluations == 21 and worst.epsilon == pytest.approx(5.31, abs=0.005)
    # Devices enrolled after the first version's evaluations carry only the later ones;
    # a device no charge names carries only the population-wide charges.
    later = [charge(f"late-{i}", devices=[*DEVICES, 9]) for i in range(3)]
    assert most_charged_device(later, DELTA).evaluations == 3
    assert most_charged_device([*charges, *later], DELTA).evaluations == 24
    assert most_charged_device([charge("x", devices=None)], DELTA, plus=PLAN, asked=[7]) == (
        most_charged_device([charge("x", devices=None), charge("y", [7])], DELTA)
    )
    # One more evaluation counts only for the devices it could ask.
    assert most_charged_device(later, DELTA, plus=PLAN, asked=[42]).evaluations == 3
    assert most_charged_device(later, DELTA, plus=PLAN, asked=[9]).evaluations == 4


def test_device_budget_is_a_checked_setting(tmp_path: Path) -> None:
    raw = {"tls": {"insecure": True}, "drift": {"device_budget": 0.5, "epsilon": 1.0}}
    with pytest.raises(ConfigError, match=r"drift\.device_budget = 0\.5: must be >= drift\."):
        settings_from_dict(raw, tmp_path)
    raw["drift"] = {"device_budget": -1.0}
    with pytest.raises(ConfigError, match=r"drift\.device_budget = -1\.0: must be >= 0"):
        settings_from_dict(raw, tmp_path)
    raw["drift"] = {"device_budget": float("nan")}
    with pytest.raises(ConfigError, match=r"drift\.device_budget"):
        settings_from_dict(raw, tmp_path)
    raw["drift"] = {"budget": 3.0}
    drift = settings_from_dict(raw, tmp_path).drift
    assert drift.device_budget == 0.0 and device_cap(drift) == 3.0  # 0: drift.budget
    raw["drift"] = {"budget": 3.0, "device_budget": 8.0}
    assert device_cap(settings_from_dict(raw, tmp_path).drift) == 8.0


def _enrol(state_dir: Path, ids: list[int]) -> None:
    # clients.json as ClientRegistry.enroll writes it (the SuperLink is not needed here).
    records = {
        str(i): {"client_id": i, "node_id": 100 + i, "enrolled_at": 1.0, "revoked_at": None}
        for i in ids
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "clients.json").write_text(json.dumps({"clients": records}))


def test_the_same_model_registered_again_does_not_start_a_fresh_device_budget(tmp_path):
    settings, version = dp_version(
        tmp_path,
        {"clients": 3, "epsilon": 1.0, "delta": DELTA, "budget": 3.0, "device_budget": 8.0},
    )
    _enrol(settings.state_dir, DEVICES)
    # Two earlier versions of the model, each evaluated 7 times by the same devices.
    state = {"history": [], "charges": seven_each(["tiny-blobs@old1", "tiny-blobs@old2"])}
    (settings.state_dir / "drift.json").write_text(json.dumps(state))
    # The same training run registered again: a new version with a fresh version budget.
    registry = Registry(settings.state_dir / "registry")
    again = registry.register(version.run_dir)
    registry.promote(again.name, again.version)
    assert again.ref != version.ref

    manager = RunManager(settings, link=None)  # a submission would fail loudly
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6)
    # 14 evaluations compose to 4.22 per device; a device budget of 8.0 pays one more.
    monitor.tick()
    state = monitor.state()
    assert state["refused"] is None and state["pending"]["version"] == again.ref
    (reserved,) = state["charges"][again.ref]
    assert reserved["status"] == "reserved" and reserved["devices"] == DEVICES
    devices = state["devices"]  # what GET /drift returns (the dashboard's Drift panel)
    assert devices["evaluations_max"] == 15 and devices["budget"] == 8.0
    assert devices["epsilon_spent_max"] == pytest.approx(
        composed_epsilon([PLAN.event()] * 15, DELTA), rel=1e-9
    )
    assert devices["budget_left"] == pytest.approx(8.0 - devices["epsilon_spent_max"])
    assert state["dp"]["device_budget"] == 8.0
    assert not any(str(d) in json.dumps(devices) for d in (100, 101))  # no node ids

    # Three versions of 7 (the issue's 21, 5.31) and a device budget of 5.4: the 22nd
    # evaluation (5.45) is refused, nothing sent, though this version spent none of its 3.0.
    settings.drift.device_budget = 5.4
    charges = {**seven_each(["a@1", "a@2", "a@3"]), again.ref: []}
    (settings.state_dir / "drift.json").write_text(json.dumps({"history": [], "charges": charges}))
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6)
    runs_before = manager.run_ids()
    monitor.tick()
    state = monitor.state()
    refused = state["refused"]
    assert refused.startswith(f"drift evaluation of {again.ref} refused")
    assert "spent epsilon 5.312 of a device's drift.device_budget = 5.4" in refused
    assert "(21 evaluations could ask it)" in refused and "would compose to 5.455" in refused
    assert "nothing is sent to the devices" in refused
    assert manager.run_ids() == runs_before and state["charges"][again.ref] == []
    assert state["devices"]["budget_left"] == pytest.approx(5.4 - 5.3118, abs=1e-3)


def test_a_device_enrolled_after_the_spending_is_asked_only_with_the_others(tmp_path):
    # Without enrolment (no clients.json) every device that may connect could be asked:
    # the charge names no list and counts for the whole population.
    settings, version = dp_version(tmp_path, {"clients": 3, "delta": DELTA})
    manager = RunManager(settings, link=None)
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6)
    monitor.tick()
    (reserved,) = monitor.state()["charges"][version.ref]
    assert reserved["devices"] is None
    assert monitor.state()["devices"]["evaluations_max"] == 1
