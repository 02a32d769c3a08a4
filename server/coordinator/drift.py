"""Retraining on drift ([drift] in server.toml): every `interval_s` the coordinator submits a
federated evaluation of the promoted version of `drift.model` to the devices (a run whose
drift.json says "evaluate", see drift_run.py); when its accuracy is below `threshold` it
submits a retraining run that starts from that version, through the same submission checks
as any run (RunManager.submit).

Runs with DP are refused, with the reason in the drift state: on a DP model, the devices'
accuracy is a statistic of their data, so evaluating it is a release that would have to be
computed under secure aggregation with calibrated noise and charged to the run's budget,
and so would the retrain decision taken from it. fedveil has no such mechanism for
evaluation yet; publishing an unaccounted accuracy would break the run's guarantee.

The state (`<state_dir>/drift.json`; GET /drift, the dashboard) survives restarts: the run in
flight, the last evaluation time, and each evaluation's accuracy, threshold and outcome.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedveil.config.service import DriftSection
from fedveil.server.coordinator.drift_run import DRIFT_FILE, EVALUATE, RETRAIN
from fedveil.server.coordinator.model_versions import coordinator_registry
from fedveil.server.coordinator.rundir import FINAL, read_json, write_json
from fedveil.server.coordinator.runs import RunManager, RunNotFound, SubmissionError
from fedveil.server.registry import RegistryError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedveil.drift")

STATE_FILE = "drift.json"
HISTORY_KEPT = 100


class DriftRefused(ValueError):
    """The promoted version cannot be evaluated for drift; the message says why."""


def dp_refusal(run_config: dict[str, Any]) -> str | None:
    """Why a version trained with this run config may not be drift-evaluated (None: it may)."""
    dp = run_config.get("dp", {}).get("mechanism", "none")
    dp_sgd = float(run_config.get("client", {}).get("dp_sgd_noise", 0.0) or 0.0)
    if dp == "none" and dp_sgd == 0:
        return None
    used = f"dp.mechanism = {dp!r}" if dp != "none" else f"client.dp_sgd_noise = {dp_sgd}"
    return (
        f"drift evaluation refused: the promoted version was trained with DP ({used}). "
        "The devices' accuracy on it is a release of their data: it would have to run under "
        "secure aggregation with calibrated noise and be charged to the budget, as would the "
        "retrain decision, and fedveil has no accounted mechanism for evaluation yet"
    )


class DriftMonitor:
    def __init__(
        self,
        settings: DriftSection,
        state_dir: Path,
        manager: RunManager,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.state_dir, self.manager, self.clock = settings, state_dir, manager, clock
        self.path = state_dir / STATE_FILE

    def state(self) -> dict[str, Any]:
        state = read_json(self.path) or {}
        state.setdefault("history", [])
        return {
            **state,
            "enabled": self.cfg.enabled,
            "model": self.cfg.model,
            "interval_s": self.cfg.interval_s,
            "threshold": self.cfg.threshold,
        }

    def tick(self) -> None:
        """One look: close the drift run in flight, or start an evaluation when one is due."""
        if not self.cfg.enabled:
            return
        state = self.state()
        if state.get("pending"):
            if not self._close_pending(state):
                return  # still running
            write_json(self.path, state)
            if state.get("pending"):
                return  # a retraining run was just submitted
        if self.clock() - float(state.get("last_evaluation_at") or 0) < self.cfg.interval_s:
            return
        state["last_evaluation_at"] = self.clock()
        try:
            state["pending"] = self._submit_evaluation()
            state["refused"] = None
        except (DriftRefused, RegistryError, SubmissionError, OSError) as exc:
            if state.get("refused") != str(exc):
                log.warning("drift: %s", exc)
            state["refused"] = str(exc)
        write_json(self.path, state)

    # -- evaluation -------------------------------------------------------------
    def _submit_evaluation(self) -> dict[str, Any]:
        version = coordinator_registry(self.state_dir).resolve(self.cfg.model)
        values = self._run_config(version.run_dir)
        refusal = dp_refusal(values)
        if refusal:
            raise DriftRefused(refusal)
        values.pop("out", None)
        # No training: one exchange in which devices evaluate the version on held-out data
        # (the version's own holdout share, else drift.holdout). Nothing is aggregated, so
        # no secure aggregation; the run's other settings are the version's.
        ev = values.setdefault("eval", {})
        if not ev.get("client_holdout"):
            ev["client_holdout"] = self.cfg.holdout
        ev["federated_clients"] = self.cfg.clients
        values.setdefault("secagg", {})["enabled"] = False
        values.setdefault("server", {})["rounds"] = 1
        num_clients = int(values.get("data", {}).get("num_clients", 100))
        values["deploy"] = {
            "name": f"drift evaluation of {version.ref}",
            "wait_for_clients": min(self.cfg.clients, num_clients),
        }
        view = self._submit(values, EVALUATE, version.ref, str(version.model_path))
        log.info("drift: evaluating %s as run %s", version.ref, view["id"])
        return {"kind": EVALUATE, "run_id": view["id"], "version": version.ref}

    def _run_config(self, run_dir: Path | None) -> dict[str, Any]:
        config = None if run_dir is None else run_dir / "config.toml"
        if config is None or not config.is_file():
            raise DriftRefused(
                f"drift evaluation refused: {self.cfg.model}'s promoted version has no run "
                f"config ({config}): the devices' run is built from it"
            )
        return tomllib.loads(config.read_text())

    def _submit(self, values: dict[str, Any], kind: str, ref: str, init: str) -> dict[str, Any]:
        spec = {"kind": kind, "version": ref, "init": init}
        return self.manager.submit(
            json.dumps(values).encode(),
            "application/json",
            run_files={DRIFT_FILE: json.dumps(spec)},
            # An evaluation registers no model: its record names the version it evaluated
            # (model_version), a retraining run the version it started from (drift.parent).
            record_extra={"drift": {"kind": kind, "parent": ref}}
            | ({"model_version": ref} if kind == EVALUATE else {}),
        )

    # -- outcome ------------------------------------------------------------------
    def _close_pending(self, state: dict[str, Any]) -> bool:
        """False while the drift run in flight is not finished; else record its outcome
        (and submit a retraining run when an evaluation fell below the threshold)."""
        pending = state["pending"]
        try:
            rd = self.manager.rundir(pending["run_id"])
            record = rd.record()
        except RunNotFound:
            record, rd = {"status": "failed", "error": "the run directory is gone"}, None
        if record.get("status") not in FINAL:
            return False
        state["pending"] = None
        if pending["kind"] == RETRAIN:
            state["history"][-1]["retrain_status"] = record.get("status")
            return True
        entry: dict[str, Any] = {
            "at": self.clock(),
            "run_id": pending["run_id"],
            "version": pending["version"],
            "threshold": self.cfg.threshold,
            "status": record.get("status"),
        }
        summary = read_json(rd / "summary.json") if rd is not None else None
        accuracy = (summary or {}).get("federated_accuracy")
        if record.get("status") != "completed" or accuracy is None:
            entry["error"] = record.get("error") or "no accuracy in the run's summary"
        else:
            entry["accuracy"] = float(accuracy)
            entry["below_threshold"] = accuracy < self.cfg.threshold
        earlier = [
            e
            for e in state["history"]
            if e.get("version") == entry["version"] and e.get("retrain_status") == "completed"
        ]
        state["history"] = [*state["history"], entry][-HISTORY_KEPT:]
        if entry.get("below_threshold") and earlier:
            # Its retrained model is registered, not promoted: that is the operator's call.
            # Retraining the same version again would spend devices' time (and, for the
            # lineage, epsilon) on a model already waiting for that decision.
            entry["retrain_skipped"] = (
                f"run {earlier[-1]['retrain_run']} already retrained {entry['version']}; "
                "promote its version, or a newer one, to have it evaluated"
            )
        elif entry.get("below_threshold"):
            try:
                entry["retrain_run"] = self._submit_retrain(pending["version"])
                state["pending"] = {
                    "kind": RETRAIN,
                    "run_id": entry["retrain_run"],
                    "version": pending["version"],
                }
            except (DriftRefused, RegistryError, SubmissionError, OSError) as exc:
                entry["retrain_error"] = str(exc)
                log.warning("drift: retraining %s not submitted: %s", pending["version"], exc)
        return True

    def _submit_retrain(self, ref: str) -> str:
        """A run with the version's own config, starting from its weights."""
        version = coordinator_registry(self.state_dir).resolve(ref)
        values = self._run_config(version.run_dir)
        refusal = dp_refusal(values)
        if refusal:  # the version was checked before its evaluation; this keeps it so
            raise DriftRefused(refusal)
        values.pop("out", None)
        deploy = read_json(version.run_dir / "deploy.json") or {} if version.run_dir else {}
        deploy["name"] = f"retraining of {ref} (drift)"
        values["deploy"] = deploy
        view = self._submit(values, RETRAIN, ref, str(version.model_path))
        log.warning(
            "drift: %s fell below %.3f; retraining as run %s", ref, self.cfg.threshold, view["id"]
        )
        return str(view["id"])
