"""Drift evaluation of a version trained with DP, with a real coordinator and three real
devices on loopback, the coordinator's files read as an adversary would: the evaluation ran
under secure aggregation (the devices' results left them masked; the run's private annex
holds only the unmasked sum), what it published is that sum plus noise of the stated
scale and its accounted epsilon, no count of devices; its signed ledger verifies; the
retraining run's card composes the evaluation's epsilon into the lineage and
`fedveil privacy verify --card` agrees; and the next evaluation, past drift.budget, is
refused with nothing submitted to the devices."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import numpy as np
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
NAME = "deploy-blobs-mlp"
HOLDOUT = 0.25
EPSILON, BUDGET = 20.0, 24.0  # one evaluation fits the budget, a second does not
DRIFT = f"""[drift]
enabled = true
model = "{NAME}"
interval_s = 10
threshold = 0.9
clients = {CLIENTS}
holdout = {HOLDOUT}
epsilon = {EPSILON}
delta = 1e-6
budget = {BUDGET}
loss_cap = 4.0
"""
# Central DP with little noise and lr 1e-4: the version stays far below the threshold.
DP = '[dp]\nmechanism = "central"\nepsilon = 10000.0\nnoise_multiplier = 0.05\n'


def device_accuracies(model_path: str) -> list[float]:
    """Each device's accuracy on its held-out share (the first 25% of its file)."""
    model = build_model("mlp", (8,), 3)
    model.load_state_dict(load_file(model_path))
    out = []
    for x, y in arrays(CLIENTS)[0]:
        k = max(1, round(HOLDOUT * len(x)))
        with torch.no_grad():
            pred = model.eval()(torch.from_numpy(x[:k])).argmax(1).numpy()
        out.append(float((pred == y[:k]).mean()))
    return out


def promote_a_dp_version(dep: Deployment, out: Path) -> ModelVersion:
    toml = run_toml(rounds=1, clients=CLIENTS, per_round=CLIENTS, seed=5, name="v1", tables=DP)
    values = tomllib.loads(toml.replace("lr = 0.1", "lr = 0.0001"))
    values.pop("deploy")
    values["out"] = str(out)
    simulate(config_from_dict(values))
    registry = Registry(dep.state / "registry")
    version = registry.register(out)
    registry.promote(version.name, version.version)
    return version


def test_a_dp_version_is_evaluated_under_secure_aggregation_and_charged(tmp_path):
    dep = Deployment(tmp_path, clients=CLIENTS, extra_server_toml=DRIFT)
    try:
        dep.start_server()
        version = promote_a_dp_version(dep, tmp_path / "v1")
        truth = device_accuracies(str(version.model_path))
        true_mean = float(np.mean(truth))
        assert true_mean < 0.5
        for cid in range(CLIENTS):
            dep.enroll(cid)
            data = write_client_file(tmp_path / "data", CLIENTS, cid, "npz")
            dep.start_client(cid, "--data", str(data), "--task", "mlp")

        def drift() -> dict:
            return dep.http.get("/drift").json()  # public, as the dashboard reads it

        def settled() -> dict | None:
            # While `submitting` is set the monitor is submitting a run, and the newest
            # entry does not name its retraining run yet (drift.py writes the marker first).
            state = drift()
            return state["history"][0] if state["history"] and not state.get("submitting") else None

        entry = wait_for(settled, 300, "evaluation")
        rid = entry["run_id"]
        rd = dep.state / "runs" / rid
        assert entry["status"] == "completed" and entry["dp"] is True, entry
        # Published: the noised mean, its epsilon, the version's budget spent and left.
        assert 0.0 <= entry["accuracy"] <= 1.0 and 0.0 <= entry["loss"] <= 4.0
        assert 0 < entry["epsilon"] <= EPSILON and entry["charge"] == "charged"
        assert entry["epsilon_spent"] == pytest.approx(entry["epsilon"])
        assert entry["budget_left"] == pytest.approx(BUDGET - entry["epsilon"])
        summary = json.loads((rd / "summary.json").read_text())
        assert summary["released"] is True and summary["federated_accuracy"] == entry["accuracy"]
        public_view = dep.http.get(f"/runs/{rid}").json()["summary"]
        withheld = {"clients_asked", "clients_answered", "examples", "survivors", "sums"}
        assert not withheld & set(summary) and not withheld & set(public_view)
        assert not withheld & set(entry)

        # The curator's view, in the operator's annex only: the exact sum of the devices'
        # own accuracies (one rounding step each), never a device's own figure.
        annex = rd / "private" / "rounds.jsonl"
        assert stat.S_IMODE(annex.stat().st_mode) == 0o600
        (private,) = [json.loads(line) for line in annex.read_text().splitlines()]
        assert private["clients_answered"] == CLIENTS
        assert private["exact_accuracy"] == pytest.approx(true_mean, abs=1e-4)
        assert not {"accuracies", "per_client"} & set(private)
        # Secure aggregation: each device evaluated and masked its result (its own log);
        # the run's config had secure aggregation on and trained nothing.
        for cid in range(CLIENTS):
            log = (tmp_path / f"client-{cid}.log").read_text()
            assert "evaluated the model on this device's held-out data; the result leaves " in log
        config = tomllib.loads((rd / "config.toml").read_text())
        assert config["secagg"]["enabled"] is True and config["dp"]["mechanism"] == "none"
        # The release is the sum plus noise of the stated scale: within 5 std of the truth.
        std = summary["noise_std"] * math.sqrt(1 + true_mean**2) / CLIENTS
        assert abs(entry["accuracy"] - true_mean) < 5 * std
        assert entry["accuracy"] != pytest.approx(private["exact_accuracy"], abs=1e-9)

        verify = dep.cli("privacy", "verify", str(rd))
        assert verify.returncode == 0, verify.stderr
        assert "1 releases" in verify.stdout

        # Below the threshold: retrained (post-processing of the release, no new charge).
        assert entry["below_threshold"] is True and entry["retrain_run"]
        dep.wait_status(entry["retrain_run"], "completed", 300)
        wait_for(
            lambda: drift()["history"][0].get("retrain_status") == "completed", 60, "the retrain"
        )
        retrained = Registry(dep.state / "registry").versions(NAME)[-1]
        lineage = retrained.card["lineage"]
        assert lineage["parent"] == version.ref
        assert lineage["drift_evaluations"]["runs"] == [rid]
        assert lineage["drift_evaluations"]["epsilon"] == pytest.approx(entry["epsilon"])
        own = retrained.card["privacy"]["epsilon"]
        parent_eps = version.card["privacy"]["epsilon"]
        assert lineage["composed"]["observers"]["epsilon"] == pytest.approx(
            parent_eps + entry["epsilon"] + own
        )
        retrain_dir = dep.state / "runs" / entry["retrain_run"]
        card = dep.cli(
            "privacy",
            "verify",
            str(retrain_dir),
            "--card",
            retrained.ref,
            "--registry",
            str(dep.state / "registry"),
        )
        assert card.returncode == 0, card.stdout + card.stderr

        # The next evaluation would compose past drift.budget: refused, nothing submitted.
        runs_before = {r["id"] for r in dep.http.get("/runs").json()}
        refused = wait_for(lambda: drift()["refused"], 60, "the budget refusal")
        assert "drift.budget = 24" in refused and "nothing is sent to the devices" in refused
        state = drift()
        assert len(state["history"]) == 1 and state["pending"] is None
        assert {r["id"] for r in dep.http.get("/runs").json()} == runs_before
        # drift.device_budget not set (0): drift.budget (drift_devices.device_cap); GET
        # /drift states the most-charged device across versions.
        assert state["dp"] == {
            "epsilon": EPSILON,
            "delta": 1e-6,
            "budget": BUDGET,
            "device_budget": BUDGET,
            "loss_cap": 4.0,
        }
        assert state["devices"]["epsilon_spent_max"] == pytest.approx(entry["epsilon"], rel=1e-3)
    finally:
        dep.close()
