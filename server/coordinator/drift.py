"""Retraining on drift ([drift] in server.toml): every `interval_s` the coordinator submits a
federated evaluation of the promoted version of `drift.model` to the devices (a run whose
drift.json says "evaluate", see drift_run.py); when its accuracy is below `threshold` it
submits a retraining run that starts from that version, through the same submission checks
as any run (RunManager.submit).

A version trained with distributed DP is not evaluated (refused, naming dp.mechanism, nothing
sent): its epsilon holds against the coordinator, and an evaluation's noise is the
coordinator's own. Any other version trained with DP (`[dp]` central, or DP-SGD on the
devices) is evaluated as a DP release: under secure aggregation (the version's threat
mode, semi-honest if it had none) with central Gaussian noise calibrated to
`drift.epsilon`/`drift.delta` (privacy/dp/evaluation.py), and charged to `drift.budget`,
the most the evaluations of one version may compose to (drift_budget.py), and to
`drift.device_budget`, the most the evaluations of every version that could ask one
enrolled device may compose to (drift_devices.py). The charge is
reserved before the run is submitted; an evaluation the budget cannot pay for is refused,
naming drift.budget, and nothing is sent to the devices; so is one for which too few
devices are connected to reach secure aggregation's threshold. Only the noised mean
accuracy and loss and the accounted epsilon are published; the retrain decision is
post-processing of them (no further charge), and the retraining run carries the
evaluations' ledgers, so its card counts them in the lineage's composed epsilon
(server/registry/drift_evaluations.py).

The state (`<state_dir>/drift.json`; GET /drift, the dashboard) survives restarts: the run in
flight, the last evaluation time, each evaluation's accuracy, threshold and outcome (and
under DP its epsilon and the version's budget spent and left), and the charges per version.

A submission is one durable step: before a drift run is submitted, the state on disk says
so (`submitting`: kind, version, wall time, with a DP evaluation's reservation in the same
write). A coordinator killed between the run's creation and the state's next write leaves
that marker; the first look after a restart (`_reconcile`) finds the run it created (a
drift run of that kind and version created since) and adopts it (an evaluation becomes
the run in flight, its reservation bound to it; a retraining is taken as the one the
closed evaluation asked for), or, when no run was created, drops the marker and cancels
the reservation. No evaluation goes unsettled, and none is submitted twice.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedveil.config import ConfigError, config_from_dict
from fedveil.config.service_settings import DriftSection
from fedveil.privacy.dp.evaluation import EvaluationPlan
from fedveil.privacy.secagg.feasibility import MIN_CLIENTS
from fedveil.server.coordinator.drift_budget import DriftBudget
from fedveil.server.coordinator.drift_devices import (
    counted_charges,
    device_cap,
    enrolled_devices,
    most_charged_device,
)
from fedveil.server.coordinator.drift_run import DRIFT_FILE, EVALUATE, RETRAIN
from fedveil.server.coordinator.model_versions import coordinator_registry
from fedveil.server.coordinator.rundir import FINAL, read_json, write_json
from fedveil.server.coordinator.runs import RunManager, RunNotFound, SubmissionError
from fedveil.server.engine.dp_from_config import smallest_feasible_group
from fedveil.server.registry import RegistryError
from fedveil.server.registry.drift_evaluations import (
    DRIFT_EVALUATIONS_FILE,
    evaluations_record,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedveil.drift")

STATE_FILE = "drift.json"
HISTORY_KEPT = 100


class DriftRefused(ValueError):
    """The promoted version cannot be evaluated for drift; the message says why."""


def trained_with_dp(run_config: dict[str, Any]) -> str | None:
    """What made a version's training DP (None: it had no DP), e.g. "dp.mechanism = 'central'"."""
    dp = run_config.get("dp", {}).get("mechanism", "none")
    dp_sgd = float(run_config.get("client", {}).get("dp_sgd_noise", 0.0) or 0.0)
    if dp == "none" and dp_sgd == 0:
        return None
    return f"dp.mechanism = {dp!r}" if dp != "none" else f"client.dp_sgd_noise = {dp_sgd}"


def _unreleased(summary: dict[str, Any]) -> str | None:
    """Why a DP evaluation published nothing, without its reason (which may count devices:
    the run's private annex has it)."""
    if summary.get("released") is not False:
        return None
    stage = str(summary.get("aborted", "")).replace("_", " ")
    return f"secure aggregation aborted {stage}: nothing released".replace("  ", " ")


def _refuse_against_coordinator(ref: str, values: dict[str, Any]) -> None:
    """A version whose users were promised a guarantee against the coordinator (distributed
    DP, or DP-SGD on the devices) is not evaluated, nothing sent: an evaluation noised by the
    coordinator (central DP, the only noise evaluations have) shows it their exact sums."""
    _refuse_dp_sgd(ref, values)
    if values.get("dp", {}).get("mechanism") != "distributed":
        return
    raise DriftRefused(
        f"drift evaluation of {ref} refused: the version was trained with dp.mechanism = "
        "'distributed', whose epsilon holds against the coordinator, and a drift evaluation "
        "is noised by the coordinator itself (central DP): it would see the exact sums of "
        "the version's users' accuracy and loss. Distributed (Skellam) noise for "
        "evaluations does not exist yet; nothing is sent to the devices. Watch a version "
        "trained with dp.mechanism = 'central', or evaluate on the server's own test set"
    )


def _refuse_dp_sgd(ref: str, values: dict[str, Any]) -> None:
    """DP-SGD's example-level epsilon is each device's own, against whoever sees its
    updates, the coordinator included. Any client.dp_sgd_noise but exactly 0 (NaN and
    strings too: fail closed) counts as DP-SGD."""
    noise = values.get("client", {}).get("dp_sgd_noise", 0.0)
    if noise == 0 and not isinstance(noise, bool):
        return
    raise DriftRefused(
        f"drift evaluation of {ref} refused: the version was trained with "
        f"client.dp_sgd_noise = {noise!r} (DP-SGD on the devices), whose example-level "
        "epsilon holds against the coordinator, and a drift evaluation is noised by the "
        "coordinator itself (central DP): it would see the exact sums of the version's "
        "users' accuracy and loss. Nothing is sent to the devices. Watch a version trained "
        "with dp.mechanism = 'central' only, or evaluate on the server's own test set"
    )


@lru_cache(maxsize=8)
def evaluation_plan(epsilon: float, delta: float, loss_cap: float) -> EvaluationPlan:
    """The calibrated plan of one DP evaluation (the same settings give the same plan)."""
    return EvaluationPlan.calibrate(epsilon, delta, loss_cap)


class DriftMonitor:
    def __init__(
        self,
        settings: DriftSection,
        state_dir: Path,
        manager: RunManager,
        clock: Callable[[], float] = time.time,
        connected: Callable[[], int | None] = lambda: None,
        enrolled: Callable[[], list[int] | None] | None = None,
    ) -> None:
        """`connected`: the devices connected now (None: unknown), for secure aggregation's
        threshold under DP (the service's count of online enrolled devices). `enrolled`:
        the devices an evaluation could ask (None: every device; default: the
        coordinator's enrolled, unrevoked client ids), charged across versions."""
        self.cfg, self.state_dir, self.manager, self.clock = settings, state_dir, manager, clock
        self.connected = connected
        self.enrolled = enrolled or (lambda: enrolled_devices(state_dir))
        self.path = state_dir / STATE_FILE
        self._reconciled = False

    def state(self) -> dict[str, Any]:
        state = read_json(self.path) or {}
        state.setdefault("history", [])
        devices = most_charged_device(counted_charges(state), self.cfg.delta)
        return {
            **state,
            # The most-charged device's epsilon across every version (drift_devices.py).
            "devices": devices.to_dict(device_cap(self.cfg)),
            "enabled": self.cfg.enabled,
            "model": self.cfg.model,
            "interval_s": self.cfg.interval_s,
            "threshold": self.cfg.threshold,
            # What a DP version's evaluations are charged (budget: per watched version).
            "dp": {
                "epsilon": self.cfg.epsilon,
                "delta": self.cfg.delta,
                "budget": self.cfg.budget,
                "device_budget": device_cap(self.cfg),
                "loss_cap": self.cfg.loss_cap,
            },
        }

    def tick(self) -> None:
        """One look: close the drift run in flight, or start an evaluation when one is due."""
        if not self.cfg.enabled:
            return
        state = self.state()
        if not self._reconciled:
            self._reconciled = True
            if state.get("submitting") and self._reconcile(state):
                write_json(self.path, state)
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
            state["pending"] = self._submit_evaluation(state)
            state["refused"] = None
        # ValueError: a DP plan that cannot be calibrated or composed (named in its message).
        except (DriftRefused, RegistryError, SubmissionError, OSError, ValueError) as exc:
            if state.get("refused") != str(exc):
                log.warning("drift: %s", exc)
            state["refused"] = str(exc)
        write_json(self.path, state)

    # -- evaluation -------------------------------------------------------------
    def _submit_evaluation(self, state: dict[str, Any]) -> dict[str, Any]:
        version = coordinator_registry(self.state_dir).resolve(self.cfg.model)
        values = self._run_config(version.run_dir)
        values.pop("out", None)
        if trained_with_dp(values):
            _refuse_against_coordinator(version.ref, values)
            return self._submit_dp_evaluation(
                state, version.ref, str(version.checked_model_path()), values
            )
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
        view = self._submit(state, values, EVALUATE, version.ref, str(version.checked_model_path()))
        log.info("drift: evaluating %s as run %s", version.ref, view["id"])
        return {"kind": EVALUATE, "run_id": view["id"], "version": version.ref}

    def _submit_dp_evaluation(
        self, state: dict[str, Any], ref: str, model: str, values: dict[str, Any]
    ) -> dict[str, Any]:
        """A DP version's evaluation: refused (nothing sent) past the budget or below
        secure aggregation's threshold; else reserved, then submitted."""
        plan = evaluation_plan(self.cfg.epsilon, self.cfg.delta, self.cfg.loss_cap)
        budget = DriftBudget(state)
        after = budget.spent(ref, self.cfg.delta, plus=plan)
        if after > self.cfg.budget:
            spent = budget.spent(ref, self.cfg.delta)
            raise DriftRefused(
                f"drift evaluation of {ref} refused: its evaluations have spent epsilon "
                f"{spent:.4g} of drift.budget = {self.cfg.budget:g}, and one more (drift.epsilon "
                f"= {self.cfg.epsilon:g}) would compose to {after:.4g} > drift.budget; nothing "
                "is sent to the devices. Promote another version, or raise drift.budget"
            )
        asked = self.enrolled()
        self._check_device_budget(state, plan, asked, ref)
        values = self._dp_evaluation_config(values, self._dp_cohort(values), ref)
        dp = {"plan": plan.to_dict(), "prior": budget.prior(ref), "budget": self.cfg.budget}
        charge = budget.reserve(ref, plan, self.clock(), asked)
        # The charge goes to disk with the submission marker, before the run exists (_submit).
        try:
            view = self._submit(state, values, EVALUATE, ref, model, dp=dp)
        except (SubmissionError, OSError):
            budget.cancel(ref, charge)
            raise
        charge["run_id"] = view["id"]
        log.info(
            "drift: evaluating %s under DP (epsilon %g, composed %.4g of budget %g) as run %s",
            ref,
            plan.epsilon,
            after,
            self.cfg.budget,
            view["id"],
        )
        return {"kind": EVALUATE, "run_id": view["id"], "version": ref, "dp": True}

    def _check_device_budget(
        self, state: dict[str, Any], plan: EvaluationPlan, asked: list[int] | None, ref: str
    ) -> None:
        """Refused (nothing sent) when one more evaluation would take a device it could ask
        past drift.device_budget, composed across every version's evaluations."""
        charges = counted_charges(state)
        after = most_charged_device(charges, self.cfg.delta, plus=plan, asked=asked)
        if not (after.epsilon <= device_cap(self.cfg)):
            spent = most_charged_device(charges, self.cfg.delta)
            raise DriftRefused(
                f"drift evaluation of {ref} refused: the drift evaluations of every version "
                f"have spent epsilon {spent.epsilon:.4g} of a device's drift.device_budget = "
                f"{device_cap(self.cfg):g} ({spent.evaluations} evaluations could ask it), "
                f"and one more (drift.epsilon = {self.cfg.epsilon:g}) would compose to "
                f"{after.epsilon:.4g} > drift.device_budget; nothing is sent to the devices. "
                "A new version, or the same model registered again, does not reset it"
            )

    def _dp_cohort(self, values: dict[str, Any]) -> int:
        """How many devices the evaluation asks: drift.clients, at most those connected,
        and enough for secure aggregation's threshold under the version's threat model."""
        num_clients = int(values.get("data", {}).get("num_clients", 100))
        want = min(self.cfg.clients, num_clients)
        connected = self.connected()
        cohort = want if connected is None else min(want, connected)
        secagg = self._secagg_section(values)
        try:
            cfg = config_from_dict({**values, "secagg": secagg, "dp": {"mechanism": "none"}})
        except ConfigError as exc:
            raise DriftRefused(f"drift evaluation refused: the version's config: {exc}") from None
        smallest = smallest_feasible_group(cfg, max(want, MIN_CLIENTS))
        if smallest is None or cohort < smallest:
            need = f"at least {smallest}" if smallest else f"more than drift.clients = {want}"
            raise DriftRefused(
                f"drift evaluation refused: {cohort} devices would evaluate (drift.clients = "
                f"{self.cfg.clients}, {connected if connected is not None else 'unknown'} "
                f"connected), and secure aggregation's threshold under secagg.threat = "
                f"{cfg.secagg.threat!r} (adversarial_rate {cfg.secagg.adversarial_rate:g}, "
                f"dropout_rate {cfg.secagg.dropout_rate:g}) needs {need}; nothing is sent "
                "to the devices"
            )
        return cohort

    @staticmethod
    def _secagg_section(values: dict[str, Any]) -> dict[str, Any]:
        """The version's secure aggregation when it had one (its threat mode and rates),
        else the semi-honest default; on either way."""
        section = values.get("secagg") or {}
        own = dict(section) if section.get("enabled") else {}
        return own | {"enabled": True}

    def _dp_evaluation_config(
        self, values: dict[str, Any], cohort: int, ref: str
    ) -> dict[str, Any]:
        """The version's config as its DP evaluation runs it: one secure-aggregation session
        of `cohort` devices, nothing trained (the DP of the evaluation is in drift.json)."""
        values = dict(values)
        values["secagg"] = self._secagg_section(values)
        values["dp"] = {"mechanism": "none"}
        values["client"] = {**values.get("client", {}), "dp_sgd_noise": 0.0}
        values["server"] = {
            **values.get("server", {}),
            "rounds": 1,
            "mode": "sync",
            "sampling": "fixed",
            "per_round": cohort,
            "aggregator": "mean",
        }
        ev = dict(values.get("eval", {}))
        if not ev.get("client_holdout"):
            ev["client_holdout"] = self.cfg.holdout
        ev["federated_clients"] = cohort
        values["eval"] = ev
        values["deploy"] = {"name": f"drift evaluation of {ref} (DP)", "wait_for_clients": cohort}
        return values

    def _run_config(self, run_dir: Path | None) -> dict[str, Any]:
        config = None if run_dir is None else run_dir / "config.toml"
        if config is None or not config.is_file():
            raise DriftRefused(
                f"drift evaluation refused: {self.cfg.model}'s promoted version has no run "
                f"config ({config}): the devices' run is built from it"
            )
        return tomllib.loads(config.read_text())

    def _submit(
        self,
        state: dict[str, Any],
        values: dict[str, Any],
        kind: str,
        ref: str,
        init: str,
        *,
        dp: dict[str, Any] | None = None,
        files: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Submit a drift run, durably: the marker (and the state with it) is on disk
        before the run exists; the caller's next write clears it (`_reconcile`)."""
        state["submitting"] = {"kind": kind, "version": ref, "at": time.time(), "dp": bool(dp)}
        write_json(self.path, state)
        try:
            view = self._submit_run(values, kind, ref, init, dp=dp, files=files)
        except BaseException:
            state["submitting"] = None  # nothing was created (the caller writes the state)
            raise
        state["submitting"] = None
        return view

    def _reconcile(self, state: dict[str, Any]) -> bool:
        """After a restart with a submission marker on disk: adopt the run that submission
        created, or cancel what it reserved; whether the state changed."""
        marker = state["submitting"]
        kind, ref = marker.get("kind"), marker.get("version")
        known = {(state.get("pending") or {}).get("run_id")}
        for entry in state["history"]:
            known |= {entry.get("run_id"), entry.get("retrain_run")}
        orphan = None
        for rid in self.manager.run_ids():  # newest first
            try:
                record = self.manager.rundir(rid).record()
            except (RunNotFound, OSError, ValueError):
                continue
            drift = record.get("drift") or {}
            if (
                rid not in known
                and (drift.get("kind"), drift.get("parent")) == (kind, ref)
                and float(record.get("created_at") or 0) >= float(marker.get("at") or 0) - 1
            ):
                orphan = rid
                break
        budget = DriftBudget(state)
        unbound = [c for c in budget.counted(ref) if c.get("run_id") is None]
        if orphan is None:
            log.warning(
                "drift: a %s of %s was being submitted at a crash; none was "
                "created: nothing to adopt, its reservation cancelled",
                kind,
                ref,
            )
            for charge in unbound:
                budget.cancel(ref, charge)
            asked = [e for e in state["history"] if e.get("version") == ref]
            if kind == RETRAIN and asked and not asked[-1].get("retrain_run"):
                asked[-1]["retrain_error"] = "the coordinator stopped before submitting it"
            state["submitting"] = None
            return True
        log.warning(
            "drift: run %s (%s of %s) was submitted just before a crash: adopted", orphan, kind, ref
        )
        if kind == EVALUATE:
            for charge in unbound[-1:]:
                charge["run_id"] = orphan
            state["pending"] = {"kind": EVALUATE, "run_id": orphan, "version": ref} | (
                {"dp": True} if marker.get("dp") else {}
            )
        else:  # the evaluation that asked for it was closed in the same write as the marker
            asked = [e for e in state["history"] if e.get("version") == ref]
            if asked and asked[-1].get("below_threshold") and not asked[-1].get("retrain_run"):
                asked[-1]["retrain_run"] = orphan
            state["pending"] = {"kind": RETRAIN, "run_id": orphan, "version": ref}
        state["submitting"] = None
        return True

    def _submit_run(
        self,
        values: dict[str, Any],
        kind: str,
        ref: str,
        init: str,
        *,
        dp: dict[str, Any] | None = None,
        files: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        spec = {"kind": kind, "version": ref, "init": init} | ({"dp": dp} if dp else {})
        return self.manager.submit(
            json.dumps(values).encode(),
            "application/json",
            run_files={DRIFT_FILE: json.dumps(spec), **(files or {})},
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
        if pending.get("dp"):
            self._settle_dp(state, pending, rd, summary or {}, entry)
        accuracy = (summary or {}).get("federated_accuracy")
        if record.get("status") != "completed" or accuracy is None:
            entry["error"] = (
                record.get("error")
                or _unreleased(summary or {})
                or "no accuracy in the run's summary"
            )
        else:
            # Under DP the noised release: the decision below is post-processing of it.
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
                entry["retrain_run"] = self._submit_retrain(pending["version"], state)
                state["pending"] = {
                    "kind": RETRAIN,
                    "run_id": entry["retrain_run"],
                    "version": pending["version"],
                }
            except (DriftRefused, RegistryError, SubmissionError, OSError) as exc:
                entry["retrain_error"] = str(exc)
                log.warning("drift: retraining %s not submitted: %s", pending["version"], exc)
        return True

    def _settle_dp(
        self,
        state: dict[str, Any],
        pending: dict[str, Any],
        rd: Any,
        summary: dict[str, Any],
        entry: dict[str, Any],
    ) -> None:
        """A DP evaluation's charge, kept or refunded from its ledger, and the public
        figures of its entry: its epsilon and the version's budget spent and left (never a
        count of devices; those are in the run's private annex)."""
        ref = pending["version"]
        budget = DriftBudget(state)
        charge = budget.settle(ref, pending["run_id"], rd.path if rd is not None else None)
        spent = budget.spent(ref, self.cfg.delta)
        entry.update(
            dp=True,
            epsilon=float(charge["epsilon"]) if charge and charge["status"] != "refunded" else 0.0,
            delta=self.cfg.delta,
            epsilon_spent=spent,
            budget=self.cfg.budget,
            budget_left=max(0.0, self.cfg.budget - spent),
            charge=charge["status"] if charge else None,
            device_epsilon_spent_max=most_charged_device(
                counted_charges(state), self.cfg.delta
            ).epsilon,
            device_budget=device_cap(self.cfg),
        )
        if summary.get("federated_loss") is not None:
            entry["loss"] = float(summary["federated_loss"])

    def _submit_retrain(self, ref: str, state: dict[str, Any]) -> str:
        """A run with the version's own config, starting from its weights; from a DP
        version it carries the ledgers of the version's evaluations (its card counts them)."""
        version = coordinator_registry(self.state_dir).resolve(ref)
        values = self._run_config(version.run_dir)
        values.pop("out", None)
        files: dict[str, str] = {}
        if trained_with_dp(values):
            try:
                ledgers = DriftBudget(state).ledgers(ref, self.state_dir / "runs")
            except (OSError, ValueError) as exc:
                raise DriftRefused(
                    f"the ledgers of {ref}'s drift evaluations cannot be read ({exc}): the "
                    "retrained model's card could not count them"
                ) from None
            files[DRIFT_EVALUATIONS_FILE] = evaluations_record(ref, ledgers)
        deploy = read_json(version.run_dir / "deploy.json") or {} if version.run_dir else {}
        deploy["name"] = f"retraining of {ref} (drift)"
        values["deploy"] = deploy
        view = self._submit(
            state, values, RETRAIN, ref, str(version.checked_model_path()), files=files
        )
        log.warning(
            "drift: %s fell below %.3f; retraining as run %s", ref, self.cfg.threshold, view["id"]
        )
        return str(view["id"])
