"""Retraining on drift ([drift] in server.toml), with a real coordinator and three devices:
the promoted version is evaluated on the devices' held-out data (the accuracy the test
computes itself from the same files), and falling below the threshold submits a retraining
run that starts from that version's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib
import torch
from deploy_task import arrays, write_client_file
from deployment_harness import Deployment, run_toml, wait_for
from safetensors.torch import load_file

from fedveil.builtin_models import build_model
from fedveil.config import config_from_dict
from fedveil.server.registry import ModelVersion, Registry
from fedveil.simulations.simulate_run import simulate

pytestmark = [pytest.mark.flower, pytest.mark.slow]

CLIENTS = 3
NAME = "deploy-blobs-mlp"  # the registry's name for task deploy-blobs/mlp
HOLDOUT = 0.25
DRIFT = f"""[drift]
enabled = true
model = "{NAME}"
interval_s = 10
threshold = 0.9
clients = {CLIENTS}
holdout = {HOLDOUT}
"""


def held_out_accuracy(model_path: str) -> float:
    """What the devices should report: the version on the first 25% of each device's file,
    combined as the coordinator combines them: each device's weight is its count, capped
    at the median count (drift_run.robust_summary; was the plain example-weighted mean)."""
    model = build_model("mlp", (8,), 3)
    model.load_state_dict(load_file(model_path))
    per_device = []
    for x, y in arrays(CLIENTS)[0]:
        k = max(1, round(HOLDOUT * len(x)))
        with torch.no_grad():
            pred = model.eval()(torch.from_numpy(x[:k])).argmax(1).numpy()
        per_device.append((k, int((pred == y[:k]).sum()) / k))
    counts = sorted(k for k, _ in per_device)
    cap = counts[(len(counts) - 1) // 2]
    weights = [min(k, cap) for k, _ in per_device]
    return sum(w * a for w, (_, a) in zip(weights, per_device, strict=True)) / sum(weights)


def promote_a_version(dep: Deployment, out: Path) -> ModelVersion:
    """A barely trained model (lr 1e-4: 3% accuracy, far below the 0.9 threshold), trained
    by a simulation of the deployed config and registered as `fedveil models register` does."""
    values = tomllib.loads(
        run_toml(rounds=1, clients=CLIENTS, per_round=CLIENTS, seed=5, name="v1").replace(
            "lr = 0.1", "lr = 0.0001"
        )
    )
    values.pop("deploy")
    values["out"] = str(out)
    simulate(config_from_dict(values))
    registry = Registry(dep.state / "registry")
    version = registry.register(out)
    registry.promote(version.name, version.version)
    return version


def test_drift_evaluates_the_promoted_version_and_retrains_below_threshold(tmp_path):
    dep = Deployment(tmp_path, clients=CLIENTS, extra_server_toml=DRIFT)
    try:
        dep.start_server()
        # Nothing promoted yet: the monitor says so and submits nothing.
        state = wait_for(
            lambda: dep.http.get("/drift", headers=dep.admin).json().get("refused"),
            30,
            "the drift monitor to look",
        )
        assert NAME in state
        public = dep.http.get("/drift")  # the dashboard's read: no server paths in it
        assert public.status_code == 200 and str(dep.root) not in public.text
        version = promote_a_version(dep, tmp_path / "v1")
        assert version.name == NAME
        expected = held_out_accuracy(str(version.model_path))
        assert expected < 0.9
        for cid in range(CLIENTS):
            dep.enroll(cid)
            data = write_client_file(tmp_path / "data", CLIENTS, cid, "npz")
            dep.start_client(cid, "--data", str(data), "--task", "mlp")

        def evaluated() -> dict | None:
            drift = dep.http.get("/drift", headers=dep.admin).json()
            # While `submitting` is set the monitor is submitting a run, and the newest
            # entry does not name its retraining run yet (drift.py writes the marker first).
            return drift["history"][0] if drift["history"] and not drift.get("submitting") else None

        entry = wait_for(evaluated, 240, "a drift evaluation")
        assert entry["version"] == version.ref and entry["status"] == "completed", entry
        assert entry["accuracy"] == pytest.approx(expected, abs=1e-6)
        assert entry["below_threshold"] is True and entry["retrain_run"]
        summary = json.loads((dep.state / "runs" / entry["run_id"] / "summary.json").read_text())
        assert summary["clients_answered"] == CLIENTS
        assert not (dep.state / "runs" / entry["run_id"] / "model.safetensors").exists()

        retrain = dep.wait_status(entry["retrain_run"], "completed", 240)
        assert retrain["name"] == f"retraining of {version.ref} (drift)"
        rdir = dep.state / "runs" / entry["retrain_run"]
        spec = json.loads((rdir / "drift.json").read_text())
        assert spec == {"kind": "retrain", "version": version.ref, "init": str(version.model_path)}
        # It trained from the version: the same config from the seed's initialisation would
        # give the version itself again (no DP: the same model bit for bit); one more round
        # at lr 1e-4 moves it a little.
        start = load_file(str(version.model_path))
        after = load_file(str(rdir / "model.safetensors"))
        moved = max(float((after[k] - v).abs().max()) for k, v in start.items())
        assert 1e-6 < moved < 1e-2, moved
        wait_for(
            lambda: (evaluated() or {}).get("retrain_status") == "completed",
            30,
            "the retrain recorded",
        )
        # The retrained model is registered with its lineage, not promoted (the operator's
        # call): the next evaluation of the same version does not retrain it again.
        retrained = Registry(dep.state / "registry").versions(NAME)[-1]
        assert retrained.card["lineage"]["parent"] == version.ref
        assert retrained.version == version.version + 1 and retrained.stage != "production"
        again = wait_for(
            lambda: (h := dep.http.get("/drift", headers=dep.admin).json()["history"])[1:] and h[1],
            240,
            "the second drift evaluation",
        )
        assert again["below_threshold"] is True and "retrain_run" not in again, again
        assert entry["retrain_run"] in again["retrain_skipped"]
    finally:
        dep.close()
