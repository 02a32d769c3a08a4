"""Prometheus text for /metrics, and the per-run round figures the dashboard shows.

Per-run figures come from each run's metrics.jsonl, read incrementally (only
new lines are parsed on each scrape), as the public may see them (no
participation counts under DP: publication.py); service counters (requests refused,
Fleet bytes) are kept in memory since start-up, as Prometheus expects of
counters. Epsilon spent and budget: only what the run's signed ledger proves
(privacy/ledger.jsonl, checked by verify_ledger against the coordinator's own key
store: its last release's epsilon, and the opening's budget), never report.json or a
round record, which anyone who can write the state directory can edit. A running
run's ledger is not closed yet: there every complete line must verify. A ledger that
fails verification otherwise (an edited line, lines cut from a finished run's end)
exposes no epsilon at all rather than a smaller one. Verified once per change of the
ledger file (size, mtime), not per scrape.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.privacy.dp.ledger import RELEASE, entry_kind
from fedveil.privacy.dp.verify import STATUS_FAILED, verify_ledger
from fedveil.server.coordinator.fleet_counters import FleetCounterFile
from fedveil.server.coordinator.publication import public_record, run_is_dp
from fedveil.server.engine.privacy_report import ledger_path


@dataclass
class RunFigures:
    offset: int = 0
    dp: bool = True  # read from config.toml (written before any round) at the first line
    rounds: int = 0
    applied: int = 0
    dropped: int = 0
    aggregated: int = 0
    duration_sum: float = 0.0
    last_duration: float = 0.0
    test_accuracy: float | None = None
    test_loss: float | None = None
    train_loss: float | None = None
    # {check: clients dropped}; only runs without DP publish it (docs/explanation/trust-model.md)
    drops_by_reason: Counter[str] = field(default_factory=Counter)


@dataclass
class ServiceCounters:
    rejected: Counter[str] = field(default_factory=Counter)
    fleet_requests: int = 0
    fleet_rejected: Counter[str] = field(default_factory=Counter)
    fleet_bytes_in: int = 0
    fleet_bytes_out: int = 0
    fleet_idle: int = 0  # PullMessages answered from memory (idle_polls.py)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Where the Fleet counts are shared with the SuperLink's process, which serves the
    # Fleet API (fleet_counters.py); None when the counts are this object's own.
    fleet_file: FleetCounterFile | None = None

    def reject(self, reason: str) -> None:
        with self.lock:
            self.rejected[reason] += 1

    def fleet_served(self, bytes_in: int, bytes_out: int) -> None:
        with self.lock:
            self.fleet_requests += 1
            self.fleet_bytes_in += bytes_in
            self.fleet_bytes_out += bytes_out
            if self.fleet_file is not None:
                self.fleet_file.served(bytes_in, bytes_out)

    def fleet_refused(self, reason: str) -> None:
        with self.lock:
            self.fleet_rejected[reason] += 1
            if self.fleet_file is not None:
                self.fleet_file.refused(reason)

    def fleet_idle_answered(self) -> None:
        with self.lock:
            self.fleet_idle += 1
            if self.fleet_file is not None:
                self.fleet_file.idle_answered()

    def fleet_idle_total(self) -> int:
        with self.lock:
            return self.fleet_file.idle_count() if self.fleet_file is not None else self.fleet_idle

    def fleet_snapshot(self) -> tuple[int, Counter[str], int, int]:
        """(requests, refusals by reason, bytes in, bytes out): the shared file's if any."""
        with self.lock:
            if self.fleet_file is not None:
                return self.fleet_file.snapshot()
            return (
                self.fleet_requests,
                Counter(self.fleet_rejected),
                self.fleet_bytes_in,
                self.fleet_bytes_out,
            )


Privacy = tuple[float | None, float | None]  # (epsilon spent, epsilon budget)


class RoundsCache:
    def __init__(self) -> None:
        self._figures: dict[Path, RunFigures] = {}
        self._privacy: dict[Path, tuple[tuple[int, int, bool], Privacy]] = {}
        self._lock = threading.Lock()

    def privacy(self, run_dir: Path, running: bool) -> Privacy:
        """privacy_figures(run_dir, running), recomputed only when the ledger changed."""
        try:
            st = ledger_path(run_dir).stat()
        except OSError:
            return None, None
        stamp = (st.st_size, st.st_mtime_ns, running)
        with self._lock:
            cached = self._privacy.get(run_dir)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        figures = privacy_figures(run_dir, running)
        with self._lock:
            self._privacy[run_dir] = (stamp, figures)
        return figures

    def figures(self, run_dir: Path) -> RunFigures:
        path = run_dir / "metrics.jsonl"
        with self._lock:
            fig = self._figures.setdefault(path, RunFigures())
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return fig
            if size < fig.offset:  # truncated on resume: start over
                fig = self._figures[path] = RunFigures()
            if size == fig.offset:
                return fig
            if fig.offset == 0:
                fig.dp = run_is_dp(run_dir)
            with path.open("rb") as f:
                f.seek(fig.offset)
                chunk = f.read(size - fig.offset)
            end = chunk.rfind(b"\n") + 1  # a line being written stays for the next scrape
            for line in chunk[:end].splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                _add(fig, public_record(rec, fig.dp))
            fig.offset += end
            return fig


def _num(rec: dict[str, Any], key: str) -> float | None:
    v = rec.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _add(fig: RunFigures, rec: dict[str, Any]) -> None:
    fig.rounds += 1
    # DP runs publish only a status per round (no counts): it still says what was applied.
    fig.applied += bool(rec.get("applied") or rec.get("status") == "applied")
    fig.dropped += int(rec.get("dropped") or 0)
    fig.aggregated += int(rec.get("cohort_aggregated") or 0)
    reasons = rec.get("drops_by_reason")
    if isinstance(reasons, dict):
        for reason, count in reasons.items():
            if isinstance(count, int) and not isinstance(count, bool):
                fig.drops_by_reason[str(reason)] += count
    d = _num(rec, "duration_s") or 0.0
    fig.duration_sum += d
    fig.last_duration = d
    for key in ("test_accuracy", "test_loss", "train_loss"):
        v = _num(rec, key)
        if v is not None:
            setattr(fig, key, v)


def privacy_figures(run_dir: Path, running: bool) -> Privacy:
    """(epsilon spent, epsilon budget) as the run's signed ledger proves them: its last
    release's epsilon and the budget its opening states, once the ledger verifies (a
    `running` run's, not closed yet, once each complete line does); (None, None)
    without a ledger or when it fails verification."""
    try:
        data = ledger_path(run_dir).read_bytes()
    except OSError:
        return None, None
    result = verify_ledger(data)
    verified = result.entries  # entries that passed every check, in order
    still_open = running and verified == data.count(b"\n")  # only the close is missing
    if verified == 0 or (result.status == STATUS_FAILED and not still_open):
        return None, None
    entries = [json.loads(line) for line in data.split(b"\n")[:verified]]
    releases = [e for e in entries if entry_kind(e) == RELEASE]
    if not releases:  # opened, nothing released yet
        return 0.0, _finite(entries[0].get("budget_epsilon"))
    # verify_ledger holds budget_epsilon the same on every release of a run
    return _finite(releases[-1].get("epsilon")), _finite(releases[0].get("budget_epsilon"))


def _finite(value: object) -> float | None:
    """`value` as a float when it is a finite number (NaN, infinity, bool: None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


Sample = tuple[dict[str, str], float]

# Per-run families, in the order they are written: (name, type, help, figure).
RUN_FAMILIES: list[tuple[str, str, str, str]] = [
    ("fedveil_rounds_completed_total", "counter", "rounds completed", "rounds"),
    ("fedveil_rounds_applied_total", "counter", "rounds whose update was applied", "applied"),
    ("fedveil_client_dropouts_total", "counter", "sampled clients dropped from rounds", "dropped"),
    ("fedveil_client_updates_total", "counter", "client updates aggregated", "aggregated"),
    ("fedveil_round_duration_seconds_sum", "counter", "total round time", "dur_sum"),
    ("fedveil_round_duration_seconds_count", "counter", "rounds timed", "rounds"),
    ("fedveil_round_duration_seconds_last", "gauge", "last round's duration", "dur_last"),
    ("fedveil_test_accuracy", "gauge", "last central test accuracy", "acc"),
    ("fedveil_test_loss", "gauge", "last central test loss", "loss"),
    ("fedveil_epsilon_spent", "gauge", "privacy spent (epsilon)", "eps"),
    ("fedveil_epsilon_budget", "gauge", "privacy budget (epsilon)", "budget"),
    ("fedveil_run_bytes_sent_total", "counter", "bytes the SuperLink sent for a run", "sent"),
    (
        "fedveil_run_bytes_received_total",
        "counter",
        "bytes the SuperLink received for a run",
        "recv",
    ),
]
RUN_STATUSES = ("queued", "running", "completed", "failed", "stopped")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def family(name: str, kind: str, help_: str, samples: list[Sample]) -> list[str]:
    """One metric family in the Prometheus text format (HELP, TYPE, then its samples)."""
    lines = [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{lab}}} {value:g}" if lab else f"{name} {value:g}")
    return lines


def service_families(
    runs: list[dict[str, Any]], clients_connected: int | None, superlink_up: bool
) -> list[str]:
    """The SuperLink, connected clients and runs by status."""
    lines = family(
        "fedveil_superlink_up",
        "gauge",
        "1 if the SuperLink is running",
        [({}, float(superlink_up))],
    )
    if clients_connected is not None:
        lines += family(
            "fedveil_clients_connected",
            "gauge",
            "SuperNodes online now",
            [({}, float(clients_connected))],
        )
    by_status = Counter(r["status"] for r in runs)
    samples: list[Sample] = [({"status": s}, float(by_status.get(s, 0))) for s in RUN_STATUSES]
    return lines + family("fedveil_runs", "gauge", "runs by status", samples)


def run_samples(
    runs: list[dict[str, Any]], run_dirs: dict[str, Path], cache: RoundsCache
) -> dict[str, list[Sample]]:
    """Each run's figures, keyed by the `figure` column of RUN_FAMILIES (absent ones skipped)."""
    per_run: dict[str, list[Sample]] = {fig: [] for _, _, _, fig in RUN_FAMILIES}
    for r in runs:
        rid = r["id"]
        fig = cache.figures(run_dirs[rid])
        eps, budget = cache.privacy(run_dirs[rid], running=r["status"] == "running")
        values: dict[str, float | None] = {
            "rounds": fig.rounds,
            "applied": fig.applied,
            "dropped": fig.dropped,
            "aggregated": fig.aggregated,
            "dur_sum": fig.duration_sum,
            "dur_last": fig.last_duration,
            "acc": fig.test_accuracy,
            "loss": fig.test_loss,
            "eps": eps,
            "budget": budget,
            "sent": float(r.get("bytes_sent") or 0),
            "recv": float(r.get("bytes_received") or 0),
        }
        for key, value in values.items():
            if value is not None:
                per_run[key].append(({"run": rid}, value))
    return per_run


def run_families(per_run: dict[str, list[Sample]]) -> list[str]:
    lines: list[str] = []
    for name, kind, help_, fig in RUN_FAMILIES:
        lines += family(name, kind, help_, per_run[fig])
    return lines


def drop_reason_family(
    runs: list[dict[str, Any]], run_dirs: dict[str, Path], cache: RoundsCache
) -> list[str]:
    """Clients dropped per run and failed check, from the public round records (so
    never for a DP run, whose drop reasons stay in the private annex)."""
    samples: list[Sample] = []
    for r in runs:
        fig = cache.figures(run_dirs[r["id"]])
        samples += [
            ({"run": r["id"], "reason": reason}, float(count))
            for reason, count in sorted(fig.drops_by_reason.items())
        ]
    return family(
        "fedveil_client_dropouts_by_reason_total",
        "counter",
        "sampled clients dropped, by the check they failed (runs without DP)",
        samples,
    )


def counter_families(counters: ServiceCounters) -> list[str]:
    """The service's own counters since start-up (Fleet traffic, refused requests)."""
    requests, refused, bytes_in, bytes_out = counters.fleet_snapshot()
    idle = counters.fleet_idle_total()
    fleet_rejected = [({"reason": k}, v) for k, v in sorted(refused.items())]
    with counters.lock:
        api_rejected = [({"reason": k}, v) for k, v in sorted(counters.rejected.items())]
        return [
            *family(
                "fedveil_fleet_requests_total",
                "counter",
                "Fleet API requests served",
                [({}, requests)],
            ),
            *family(
                "fedveil_fleet_bytes_received_total",
                "counter",
                "request bytes from SuperNodes",
                [({}, bytes_in)],
            ),
            *family(
                "fedveil_fleet_bytes_sent_total",
                "counter",
                "response bytes to SuperNodes",
                [({}, bytes_out)],
            ),
            *family(
                "fedveil_fleet_idle_polls_answered_total",
                "counter",
                "PullMessages of nodes with nothing queued, answered from memory",
                [({}, idle)],
            ),
            *family(
                "fedveil_fleet_requests_rejected_total",
                "counter",
                "Fleet requests refused by the gateway",
                fleet_rejected,
            ),
            *family(
                "fedveil_api_requests_rejected_total",
                "counter",
                "HTTP API requests refused",
                api_rejected,
            ),
        ]


def render(
    runs: list[dict[str, Any]],
    run_dirs: dict[str, Path],
    cache: RoundsCache,
    counters: ServiceCounters,
    clients_connected: int | None,
    superlink_up: bool,
) -> str:
    """The whole /metrics page."""
    lines = [
        *service_families(runs, clients_connected, superlink_up),
        *run_families(run_samples(runs, run_dirs, cache)),
        *drop_reason_family(runs, run_dirs, cache),
        *counter_families(counters),
    ]
    return "\n".join(lines) + "\n"
