"""Experiment tracking: TensorBoard event files and MLflow runs, both optional.

A run logs its parameters (the config, flattened), each round's metrics and, when it
ends, its model, summary and config as MLflow artifacts. Under DP only what
metrics.jsonl publishes reaches a tracker (`RoundRecord.public_json`): epsilon and the
server's own evaluation, never cohort sizes, drops, client-reported losses or round
durations; and every time a tracker stores (TensorBoard's event wall times, MLflow's
metric timestamps and run start and end) is the hour the run opened in, so no two of
them measure a round (privacy/dp/public_time.py).

Trackers never stop a run: metrics.jsonl is the record; a tracker that fails (an MLflow
server gone away) is warned about once and dropped.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from fedveil.config import ConfigError, RunConfig
from fedveil.config.run_schema import TrackingConfig
from fedveil.privacy.dp.public_time import PublicClock
from fedveil.server.engine.round_record import RoundRecord

log = logging.getLogger("fedveil.server")

INSTALL_HINT = "pip install 'fedveil[tracking]'"
# How a run ended -> MLflow's run status.
MLFLOW_STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


def check_tracking_available(t: TrackingConfig) -> None:
    """ConfigError (exit 2, before any data is loaded) when a tracker is asked for and
    its package is missing."""
    wanted = [
        ("tracking.tensorboard", t.tensorboard, "tensorboard"),
        ("tracking.mlflow_uri", t.mlflow_uri, "mlflow"),
    ]
    for key, value, module in wanted:
        if value and importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"{key} = {value!r}: the {module!r} package is not installed; {INSTALL_HINT}"
            )


MLFLOW_DB = "mlflow.db"


def mlflow_tracking_uri(uri: str) -> str:
    """A directory becomes a SQLite store in it (DIR/mlflow.db: MLflow 3 reads it back
    with no extra setting, where its file store needs MLFLOW_ALLOW_FILE_STORE); an
    explicit 'file:DIR' stays a file store, as an absolute URI; other URIs (sqlite:,
    http:, ...) go to MLflow unchanged."""
    scheme, sep, rest = uri.partition(":")
    if sep and len(scheme) > 1 and scheme.isalpha():
        if scheme.lower() != "file":
            return uri
        path = rest[2:] if rest.startswith("//") else rest
        return Path(path).expanduser().resolve().as_uri()
    directory = Path(uri).expanduser().resolve()
    return f"sqlite:///{directory / MLFLOW_DB}"


def mlflow_artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside the SQLite store that a
    directory became (DIR/artifacts; MLflow's default would be the working directory),
    else MLflow's own choice."""
    tracking = mlflow_tracking_uri(uri)
    if not tracking.startswith("sqlite:///") or not tracking.endswith(f"/{MLFLOW_DB}"):
        return None
    if tracking != f"sqlite:///{Path(uri).expanduser().resolve() / MLFLOW_DB}":
        return None  # an explicit sqlite: URI
    return (Path(uri).expanduser().resolve() / "artifacts").as_uri()


def tensorboard_run_dir(root: str, run_dir: Path) -> Path:
    """One subdirectory of the TensorBoard root per run directory (its name and a short
    hash of its absolute path), so that runs logged to one root are separate runs in
    TensorBoard, and a resumed run continues its own."""
    import hashlib

    path = str(run_dir.expanduser().resolve())
    return Path(root) / f"{run_dir.name}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def publishable_metrics(record: RoundRecord, *, dp: bool) -> dict[str, float]:
    """The round's numbers a tracker may show: under DP only the keys metrics.jsonl
    publishes (the same rule, `public_json`); without DP every numeric key."""
    values = record.public_json() if dp else record.to_json()
    out: dict[str, float] = {}
    for key, value in values.items():
        if key == "round" or value is None or isinstance(value, (str, dict, list)):
            continue
        if isinstance(value, (bool, int, float)):
            out[key] = float(value)
    return out


# Sections whose settings mean nothing while their switch is off: only the switch is
# logged then. [audit] belongs to `fedveil privacy audit`, not to the run.
_SWITCHES = {"poisoning": ("attack", "none"), "dp": ("mechanism", "none")}
_ASYNC_ONLY = ("concurrency", "buffer", "staleness_exponent", "max_staleness", "ssp_bound")
_ASYNC_ONLY += ("group_size", "max_participations")


def run_params(cfg: RunConfig) -> dict[str, str]:
    """The settings the run used, as flat 'section.key' -> text (None left out, as in
    config.toml): a section switched off contributes its switch alone."""
    values = cfg.to_dict()
    values.pop("audit", None)
    for section, (switch, off) in _SWITCHES.items():
        if values[section][switch] == off:
            values[section] = {switch: off}
    if not values["secagg"]["enabled"]:
        values["secagg"] = {"enabled": False}
    if values["server"]["mode"] == "sync":
        values["server"] = {k: v for k, v in values["server"].items() if k not in _ASYNC_ONLY}
    out: dict[str, str] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": str(v) for k, v in value.items() if v is not None})
        elif value is not None:
            out[key] = str(value)
    return out


class Sink(Protocol):
    name: str

    def round(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self, status: str, files: Iterable[Path]) -> None: ...


class TensorBoardSink:
    """Event files under `log_dir`, flushed after every round (an interrupted run keeps
    all completed rounds)."""

    name = "tensorboard"

    def __init__(self, log_dir: str, params: Mapping[str, str], clock: PublicClock) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.clock = clock
        self.writer = SummaryWriter(log_dir=log_dir)
        table = "\n".join(f"| {k} | {v} |" for k, v in sorted(params.items()))
        self.writer.add_text(
            "config", "| key | value |\n|---|---|\n" + table, 0, walltime=clock.seconds()
        )
        self.writer.flush()

    def round(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step, walltime=self.clock.seconds())
        self.writer.flush()

    def close(self, status: str, files: Iterable[Path]) -> None:
        self.writer.add_text("status", status, walltime=self.clock.seconds())
        self.writer.close()


class MlflowSink:
    """One MLflow run per attempt (a resumed run starts a new one, its steps going on
    from the checkpoint's round), through MlflowClient: no global active run is touched."""

    name = "mlflow"

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        params: Mapping[str, str],
        tags: Mapping[str, str],
        clock: PublicClock,
    ) -> None:
        self.clock = clock
        tracking_uri = mlflow_tracking_uri(uri)
        if mlflow_artifact_root(uri) is not None:  # the directory holding the SQLite store
            Path(uri).expanduser().mkdir(parents=True, exist_ok=True)
        if tracking_uri.startswith("file:"):
            # MLflow 3 keeps the file store in maintenance mode and refuses it unless
            # allowed; a local file store is what `--mlflow DIR` asks for.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(
                experiment, artifact_location=mlflow_artifact_root(uri)
            )
        )
        run = self.client.create_run(
            experiment_id, start_time=clock.millis(), run_name=run_name, tags=dict(tags)
        )
        self.run_id: str = run.info.run_id
        items = [Param(k, v[:6000]) for k, v in params.items()]  # MLflow's value limit
        for i in range(0, len(items), 100):  # and its batch limit
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        self._tag = RunTag

    def round(self, step: int, metrics: Mapping[str, float]) -> None:
        now = self.clock.millis()
        batch = [self._metric(k, v, now, step) for k, v in metrics.items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self, status: str, files: Iterable[Path]) -> None:
        try:
            for path in files:
                self.client.log_artifact(self.run_id, str(path))
            self.client.set_tag(self.run_id, "fedveil.status", status)
        finally:
            self.client.set_terminated(
                self.run_id, MLFLOW_STATUS.get(status, "FAILED"), end_time=self.clock.millis()
            )


class RunTracking:
    """The trackers a run asked for ([tracking]); `None` from `open` when none was."""

    def __init__(self, sinks: list[Sink], *, dp: bool) -> None:
        self.sinks, self.dp = sinks, dp
        self.closed = False

    @classmethod
    def open(cls, cfg: RunConfig, run_dir: Path, *, dp: bool) -> RunTracking | None:
        t = cfg.tracking
        if not (t.tensorboard or t.mlflow_uri):
            return None
        check_tracking_available(t)
        params = run_params(cfg)
        clock = PublicClock(dp=dp)
        sinks: list[Sink] = []
        if t.tensorboard:
            log_dir = str(tensorboard_run_dir(t.tensorboard, run_dir))
            sinks.append(TensorBoardSink(log_dir, params, clock))
        if t.mlflow_uri:
            tags = {"fedveil.run_dir": str(run_dir), "fedveil.dp": cfg.dp.mechanism}
            sinks.append(
                MlflowSink(t.mlflow_uri, t.mlflow_experiment, run_dir.name, params, tags, clock)
            )
        return cls(sinks, dp=dp)

    def on_round(self, record: RoundRecord) -> None:
        metrics = publishable_metrics(record, dp=self.dp)
        for sink in list(self.sinks):
            try:
                sink.round(record.round, metrics)
            except Exception as exc:  # metrics.jsonl has the round; the run goes on
                log.warning(
                    "%s tracking failed at round %d, dropped: %s", sink.name, record.round, exc
                )
                self.sinks.remove(sink)

    def close(self, status: str, files: Iterable[Path] = ()) -> None:
        """End every tracker once: 'finished', 'interrupted' or 'failed'; `files` become
        MLflow artifacts (the model, the summary, the config)."""
        if self.closed:
            return
        self.closed = True
        present = [p for p in files if p.exists()]
        for sink in self.sinks:
            try:
                sink.close(status, present)
            except Exception as exc:
                log.warning("%s tracking could not be closed: %s", sink.name, exc)


def close_unfinished(tracking: RunTracking) -> None:
    """At exit or collection of a lifecycle that never finished (a crash): mark it failed."""
    tracking.close("failed")


def summary_status(summary: Mapping[str, Any]) -> str:
    return "interrupted" if summary.get("interrupted") else "finished"
