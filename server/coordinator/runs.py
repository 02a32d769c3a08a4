"""Runs of the service: submit, list, stop, and keep each one going across crashes.

A run is a directory (rundir.py) plus one or more *attempts*, each a Flower
run on the SuperLink executing fedveil's ServerApp. The service's record
(run.json) is the truth about a run; the SuperLink's state is consulted to
see how the current attempt is doing:

- the attempt completed and the ServerApp wrote `completed`  -> completed
- a stop was requested                                          -> stopped
- the ServerApp reported an error (bad task, too few clients)   -> failed
- the attempt died for another reason (its process was killed)  -> a new
  attempt resumes from the run's last checkpoint, up to max_attempts
On start-up, runs that were active when the previous service process died
(SIGKILL, power loss) get a new attempt the same way; such interrupted
attempts do not count against max_attempts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fedveil.config import ConfigError, RunConfig, config_from_dict, device_toml, to_toml
from fedveil.server.coordinator.model_versions import register_finished_run
from fedveil.server.coordinator.rundir import (
    ACTIVE,
    FINAL,
    ROSTER_FILE,
    RUN_ID_RE,
    SERVER_LOG,
    DeploySettings,
    RunDir,
    config_dp,
    new_run_id,
    read_json,
    tail_lines,
    write_json,
)
from fedveil.server.coordinator.settings import ServerSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("fedveil.service")


class SubmissionError(ValueError):
    """A run config the service will not run: names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RunNotFound(KeyError):
    pass


class RunConflict(ValueError):
    pass


_FIELD_PATTERNS = (
    re.compile(r"^unknown key ([\w.]+)"),
    re.compile(r"^([a-z_]+(?:\.[a-z_]+)?) = "),
    re.compile(r"^\[(\w+)\]"),
    re.compile(r"^([a-z_]+\.[a-z_]+)[ :]"),
)


# An absolute or home-relative path inside free text (an error message, a summary value).
_PATH_RE = re.compile(r"(?<![\w.:/])(?:~|\.{1,2})?/[^\s'\"`,;:()\[\]{}<>]+")


def without_paths(value: Any) -> Any:
    """`value` with the server's filesystem paths replaced by '<path>' (public views).

    Run errors and summaries name files on the server (run dirs, a failing config's
    path); the unauthenticated views must not, the admin view keeps them whole.
    """
    if isinstance(value, str):
        return _PATH_RE.sub("<path>", value)
    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items() if k != "out"}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    return value


def field_of(message: str) -> str:
    """The config key a ConfigError message is about (they start with it)."""
    for pattern in _FIELD_PATTERNS:
        m = pattern.match(message)
        if m:
            return m.group(1)
    return "config"


MAX_CONFIG_DEPTH = 32  # arrays/tables/objects inside each other; real run configs use 3


def nesting_depth(text: str, toml: bool) -> int:
    """The deepest nesting of [ ] and { } in a TOML or JSON text, outside strings and comments.

    A cheap scan before parsing: Python's TOML and JSON parsers recurse per level,
    so a few hundred KB of `[[[...` would otherwise end in a RecursionError (HTTP 500).
    """
    depth = deepest = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif toml and c == "#":
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif c == '"' or (toml and c == "'"):
            quote = c * 3 if toml and text.startswith(c * 3, i) else c
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if text[i] == "\\" and c == '"' else 1
            i += len(quote) - 1
        i += 1
    return deepest


def parse_submission(
    body: bytes, content_type: str, allowed_tasks: list[str], roster: Path | None = None
) -> tuple[RunConfig, DeploySettings, str]:
    """(config, deploy settings, submitted text) or SubmissionError naming the field.
    `roster`: the server's identity roster file ([secagg] roster), if it has one."""
    values, text = _parsed_body(body, content_type)
    poisoning = values.get("poisoning")
    if isinstance(poisoning, dict) and poisoning.get("attack", "none") != "none":
        # Attacks are simulated clients' behaviour; a deployed run's clients are real devices.
        raise SubmissionError(
            "poisoning",
            f"poisoning.attack = {poisoning.get('attack')!r}: [poisoning] is simulation only "
            "(fedveil simulate); a deployed run's clients are real devices",
        )
    try:
        deploy = DeploySettings.from_dict(values.pop("deploy", None))
        # The service decides where a run lives and what engine runs it.
        values.pop("out", None)
        values["transport"] = "flower"
        cfg = config_from_dict(values)
    except ConfigError as exc:
        raise SubmissionError(field_of(str(exc)), str(exc)) from None
    if cfg.model.task is not None and cfg.model.task not in allowed_tasks:
        allowed = ", ".join(allowed_tasks) or "none (only built-in models)"
        raise SubmissionError(
            "model.task",
            f"model.task = {cfg.model.task!r}: not allowed on this server "
            f"(runs.allowed_tasks in server.toml: {allowed})",
        )
    if cfg.secagg.enabled and cfg.secagg.threat == "malicious" and roster is None:
        raise SubmissionError(
            "secagg.threat",
            "secagg.threat = 'malicious' needs the clients' identity roster, and this "
            "server has none: set [secagg] roster in server.toml (fedveil identity roster)",
        )
    if deploy.wait_for_clients > cfg.data.num_clients:
        raise SubmissionError(
            "deploy.wait_for_clients",
            f"deploy.wait_for_clients = {deploy.wait_for_clients}: must be <= "
            f"data.num_clients = {cfg.data.num_clients}",
        )
    from fedveil.config.async_dp import check_wall_clock_dp
    from fedveil.server.engine.dp_from_config import check_secagg_feasible

    try:  # rounds that could only abort are refused, not reported as "completed"
        check_wall_clock_dp(cfg)  # a deployed async run runs on the wall clock
        check_secagg_feasible(cfg, cfg.data.num_clients, deploy.wait_for_clients)
    except ConfigError as exc:
        raise SubmissionError(field_of(str(exc)), str(exc)) from None
    return cfg, deploy, text


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct (json.loads keeps the last of a repeated
    key silently: a reviewer reading the first would approve another run; TOML refuses
    them itself)."""
    values: dict[str, Any] = {}
    for key, value in pairs:
        if key in values:
            raise ValueError(f"key {key!r} appears twice in one object")
        values[key] = value
    return values


def _parsed_body(body: bytes, content_type: str) -> tuple[dict[str, Any], str]:
    """The submitted text and its table: UTF-8, nesting bounded before parsing, TOML or JSON."""
    if not body.strip():
        raise SubmissionError("body", "empty request: send a run config as TOML or JSON")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SubmissionError("body", "the run config must be UTF-8 text") from None
    is_json = "json" in content_type
    depth = nesting_depth(text, toml=not is_json)
    if depth > MAX_CONFIG_DEPTH:
        raise SubmissionError(
            "body",
            f"the run config nests arrays/tables {depth} deep; at most {MAX_CONFIG_DEPTH} "
            "levels are allowed",
        )
    # ValueError, not only the decoders' own errors: an integer of more than 4,300 digits
    # is refused by int() inside both parsers (Python's limit on int from text).
    if is_json:
        try:
            values = json.loads(text, object_pairs_hook=_unique_keys)
        except ValueError as exc:
            raise SubmissionError("body", f"not valid JSON ({exc})") from None
    else:
        try:
            values = tomllib.loads(text)
        except ValueError as exc:
            raise SubmissionError("body", f"not valid TOML ({exc})") from None
    if not isinstance(values, dict):
        raise SubmissionError("body", "the run config must be a table (TOML) or an object (JSON)")
    return values, text


# A deployed run's reply deadline when its config leaves server.round_timeout = 0: a dead
# device must not stall a round until Flower declares its node gone. Generous, so that a
# slow but live device is not dropped: max(120 s, 60 s per local epoch or 0.5 s per local
# step). Simulation keeps 0 (no deadline).
DEPLOY_TIMEOUT_FLOOR_S = 120.0
DEPLOY_TIMEOUT_PER_EPOCH_S = 60.0
DEPLOY_TIMEOUT_PER_STEP_S = 0.5


def deployed_round_timeout(cfg: RunConfig) -> float:
    """server.round_timeout for a deployed run: the config's, or the default above."""
    if cfg.server.round_timeout > 0:
        return cfg.server.round_timeout
    c = cfg.client
    work = (
        DEPLOY_TIMEOUT_PER_STEP_S * c.local_steps
        if c.local_steps > 0
        else DEPLOY_TIMEOUT_PER_EPOCH_S * c.local_epochs
    )
    return min(86_400.0, max(DEPLOY_TIMEOUT_FLOOR_S, work))


def submission_warnings(cfg: RunConfig) -> list[str]:
    """What the submitter should know before the run spends its budget (DP noise)."""
    from fedveil.server.engine.dp_from_config import noise_to_signal

    signal = noise_to_signal(cfg, cfg.data.num_clients)
    warning = signal.warning() if signal is not None else None
    return [warning] if warning else []


def _count_rounds(run_dir: Path) -> int:
    return len(RunDir(run_dir.parent.parent, run_dir.name).metrics())


class RunManager:
    def __init__(self, settings: ServerSettings, link: Any, count_rounds: Any = None) -> None:
        self.settings = settings
        self.state_dir = settings.state_dir
        self.link = link
        # rounds recorded in a run dir; the service passes its incremental reader
        self.count_rounds = count_rounds or (
            lambda path: len(RunDir(path.parent.parent, path.name).metrics())
        )
        self._final: set[str] = set()  # runs that can no longer change: skipped by reconcile
        self._lock = threading.RLock()
        (self.state_dir / "runs").mkdir(parents=True, exist_ok=True)
        self.flower_runs: dict[int, Any] = {}
        self.last_reconcile = 0.0

    # -- queries -------------------------------------------------------------
    def run_ids(self) -> list[str]:
        runs = self.state_dir / "runs"
        return sorted(
            (
                p.name
                for p in runs.iterdir()
                if RUN_ID_RE.fullmatch(p.name) and (p / "run.json").exists()
            ),
            reverse=True,
        )

    def rundir(self, run_id: str) -> RunDir:
        if not RUN_ID_RE.fullmatch(run_id):
            raise RunNotFound(run_id)
        rd = RunDir(self.state_dir, run_id)
        if not rd.exists():
            raise RunNotFound(run_id)
        return rd

    def view(self, run_id: str, admin: bool = False) -> dict[str, Any]:
        """The run as the API shows it; without `admin`, no server filesystem paths."""
        rd = self.rundir(run_id)
        record = rd.record()
        status = rd.status()
        rounds_done = self.count_rounds(rd.path)
        metrics = rd.metrics()
        out = {
            "id": run_id,
            "name": record.get("name", ""),
            "status": record.get("status"),
            "created_at": record.get("created_at"),
            "finished_at": record.get("finished_at"),
            "rounds": record.get("rounds"),
            "rounds_completed": rounds_done,
            # Rounds whose update changed the model; a completed run with none is no success.
            # Round status is public under DP, so this count reveals nothing more.
            "rounds_applied": sum(
                r.get("applied") is True or r.get("status") == "applied" for r in metrics
            ),
            # Aborted rounds (nothing released) are public under DP too, as round status.
            "rounds_aborted": sum(r.get("status") == "aborted" for r in metrics),
            # The run's DP mechanism ('none' when off): public, in its config.
            "dp": record.get("dp") or config_dp(rd.path),
            "model_version": record.get("model_version"),
            "model_version_error": record.get("model_version_error"),
            "model_version_warning": record.get("model_version_warning"),
            "phase": status.get("phase") if record.get("status") == "running" else None,
            "clients_connected": status.get("connected"),
            "error": record.get("error"),
            "attempts": record.get("attempts", []),
            "num_clients": record.get("num_clients"),
            "per_round": record.get("per_round"),
            "model": record.get("model"),
        }
        summary = read_json(rd / "summary.json")
        if summary is not None and record.get("status") == "completed":
            out["summary"] = summary
        sent = recv = 0
        for attempt in out["attempts"]:
            fr = self.flower_runs.get(attempt.get("flower_run_id"))
            sent += fr.bytes_sent if fr else attempt.get("bytes_sent", 0)
            recv += fr.bytes_recv if fr else attempt.get("bytes_recv", 0)
        out["bytes_sent"], out["bytes_received"] = sent, recv
        return out if admin else without_paths(out)

    def log_tail(self, run_id: str, lines: int) -> str:
        """The last `lines` lines of the run's server log (the ServerApp's), read from the
        end: a long log costs no more than the lines asked for."""
        path = self.rundir(run_id).path / SERVER_LOG
        if not path.is_file():
            return ""
        return tail_lines(path, lines)

    def list(self, admin: bool = False) -> list[dict[str, Any]]:
        return [self.view(rid, admin) for rid in self.run_ids()]

    # -- submit / stop ---------------------------------------------------------
    def submit(
        self,
        body: bytes,
        content_type: str,
        run_files: dict[str, str] | None = None,
        record_extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new run. `run_files` (name -> text) are written into the run directory and
        `record_extra` into its record before it can start (drift.py's runs use both)."""
        roster_path = self.settings.secagg_roster
        cfg, deploy, text = parse_submission(
            body, content_type, self.settings.allowed_tasks, roster_path
        )
        try:
            warnings = submission_warnings(cfg)
        except ValueError as exc:  # e.g. no noise multiplier meets the budget
            raise SubmissionError(field_of(str(exc)), str(exc)) from None
        for warning in warnings:
            log.warning("submitted run: %s", warning)
        roster = None
        if cfg.secagg.enabled and cfg.secagg.threat == "malicious" and roster_path is not None:
            from fedveil.privacy.secagg.identity_files import load_roster

            # Read now, not at start-up: the operator may have enrolled devices since.
            try:
                roster = load_roster(roster_path, "secagg.roster =")
            except ValueError as exc:
                raise SubmissionError("secagg.threat", f"this server's roster: {exc}") from None
        with self._lock:
            run_id = new_run_id()
            while (self.state_dir / "runs" / run_id).exists():
                run_id = new_run_id()
            rd = RunDir(self.state_dir, run_id)
            rd.path.mkdir(parents=True)
            cfg = dataclasses.replace(
                cfg,
                out=str(rd.path),
                # Recorded in the run's resolved config (config.toml), which the engine runs.
                server=dataclasses.replace(cfg.server, round_timeout=deployed_round_timeout(cfg)),
            )
            (rd / "request.toml").write_text(text)
            for name, content in (run_files or {}).items():
                (rd / name).write_text(content)
            if roster is not None:  # the run keeps the roster it started with, across resumes
                (rd / ROSTER_FILE).write_text(roster.to_json())
            (rd / "config.toml").write_text(to_toml(cfg))
            write_json(rd / "deploy.json", deploy.to_dict())
            rd.write_record(
                {
                    "id": run_id,
                    "name": deploy.name,
                    "status": "queued",
                    "created_at": time.time(),
                    "finished_at": None,
                    "rounds": cfg.server.rounds,
                    "num_clients": cfg.data.num_clients,
                    "per_round": cfg.server.per_round,
                    "model": cfg.model.task or cfg.model.name,
                    "dp": cfg.dp.mechanism,
                    "attempts": [],
                    "stop_requested": False,
                    "error": None,
                    **(record_extra or {}),
                }
            )
            log.info("run %s submitted (%s)", run_id, deploy.name or "unnamed")
            self._launch_queued()
        return {**self.view(run_id), "warnings": warnings}

    def stop(self, run_id: str) -> dict[str, Any]:
        with self._lock:
            rd = self.rundir(run_id)
            record = rd.record()
            if record["status"] in FINAL:
                raise RunConflict(f"run {run_id} is already {record['status']}")
            record["stop_requested"] = True
            if record["status"] == "queued":
                self._finish(record, "stopped")
            elif record["attempts"]:
                try:
                    self.link.stop_run(record["attempts"][-1]["flower_run_id"])
                except Exception as exc:  # the attempt may have just ended: reconcile decides
                    log.warning("run %s: stopping its Flower run: %s", run_id, exc)
            rd.write_record(record)
            log.info("run %s: stop requested", run_id)
        return self.view(run_id)

    # -- attempts ---------------------------------------------------------------
    def _launch(self, rd: RunDir, record: dict[str, Any], reason: str) -> None:
        cfg_text = (rd / "config.toml").read_text()
        cfg = config_from_dict(tomllib.loads(cfg_text))
        # Devices get only the device-facing part: no [simulation], no server paths.
        flower_id = self.link.start_run(rd.run_id, device_toml(cfg))
        record["attempts"].append(
            {
                "flower_run_id": flower_id,
                "started_at": time.time(),
                "ended_at": None,
                "reason": reason,
            }
        )
        record["status"] = "running"
        log.info(
            "run %s: attempt %d is Flower run %d (%s)",
            rd.run_id,
            len(record["attempts"]),
            flower_id,
            reason,
        )

    def _finish(self, record: dict[str, Any], status: str, error: str | None = None) -> None:
        record["status"] = status
        record["finished_at"] = time.time()
        if error:
            record["error"] = error
        log.info("run %s %s%s", record["id"], status, f": {error}" if error else "")

    def _open_runs(self) -> list[str]:
        return [rid for rid in self.run_ids() if rid not in self._final]

    def _active_count(self) -> int:
        return sum(
            1
            for rid in self._open_runs()
            if RunDir(self.state_dir, rid).record().get("status") == "running"
        )

    def _launch_queued(self) -> None:
        queued = [
            RunDir(self.state_dir, rid)
            for rid in reversed(self._open_runs())  # oldest first
            if RunDir(self.state_dir, rid).record().get("status") == "queued"
        ]
        active = self._active_count()
        for rd in queued:
            if active >= self.settings.max_active_runs:
                return
            record = rd.record()
            try:
                self._launch(rd, record, "submitted")
            except Exception as exc:
                self._finish(record, "failed", f"the SuperLink did not start the run: {exc}")
            rd.write_record(record)
            active += 1

    def reconcile(self) -> None:
        """Look at every active run once; start, resume or close attempts."""
        with self._lock:
            self.flower_runs = self.link.runs()
            for rid in self.run_ids():
                if rid in self._final:
                    continue
                rd = RunDir(self.state_dir, rid)
                record = rd.record()
                if record.get("status") in FINAL:
                    self._final.add(rid)
                if record.get("status") != "running" or not record.get("attempts"):
                    continue
                attempt = record["attempts"][-1]
                fr = self.flower_runs.get(attempt["flower_run_id"])
                if fr is not None and fr.status != "finished":
                    continue
                attempt["ended_at"] = time.time()
                attempt["outcome"] = fr.sub_status if fr else "lost"
                attempt["details"] = fr.details if fr else "the SuperLink does not know this run"
                if fr is not None:
                    attempt["bytes_sent"], attempt["bytes_recv"] = fr.bytes_sent, fr.bytes_recv
                status = rd.status()
                failures = sum(1 for a in record["attempts"] if a.get("outcome") == "failed")
                if record.get("stop_requested"):
                    self._finish(record, "stopped")
                elif status.get("phase") == "completed" and (rd / "summary.json").exists():
                    self._finish(record, "completed")
                    register_finished_run(self.state_dir, rd.path, record)
                elif (
                    status.get("phase") == "failed"
                    and status.get("flower_run_id") == attempt["flower_run_id"]
                ):
                    self._finish(record, "failed", status.get("error"))
                elif failures >= self.settings.max_attempts:
                    self._finish(
                        record,
                        "failed",
                        f"gave up after {failures} failed attempts: {attempt['details']}",
                    )
                else:
                    log.warning(
                        "run %s: attempt %d ended (%s: %s); resuming from the last checkpoint",
                        rid,
                        len(record["attempts"]),
                        attempt["outcome"],
                        attempt["details"],
                    )
                    try:
                        self._launch(rd, record, "resume after a failed attempt")
                    except Exception as exc:
                        self._finish(record, "failed", f"could not resume: {exc}")
                rd.write_record(record)
            self._launch_queued()
            self.last_reconcile = time.time()

    def resume_interrupted(self) -> list[str]:
        """After a restart: give every run that was active a new attempt (see module doc)."""
        resumed = []
        with self._lock:
            self.flower_runs = self.link.runs()
            for rid in self.run_ids():
                rd = RunDir(self.state_dir, rid)
                record = rd.record()
                if record.get("status") not in ACTIVE or record.get("status") == "queued":
                    continue
                if record.get("attempts"):
                    attempt = record["attempts"][-1]
                    fr = self.flower_runs.get(attempt["flower_run_id"])
                    if fr is not None and fr.status != "finished":
                        try:  # its ServerApp died with the previous SuperLink
                            self.link.stop_run(attempt["flower_run_id"])
                        except Exception as exc:
                            log.debug("stopping stale Flower run: %s", exc)
                    if attempt.get("ended_at") is None:
                        attempt["ended_at"] = time.time()
                        attempt["outcome"] = "interrupted"
                        attempt["details"] = "the service stopped or crashed during this attempt"
                if record.get("stop_requested"):
                    self._finish(record, "stopped")
                else:
                    try:
                        self._launch(rd, record, "resume after a service restart")
                        resumed.append(rid)
                    except Exception as exc:
                        self._finish(record, "failed", f"could not resume: {exc}")
                rd.write_record(record)
        return resumed
