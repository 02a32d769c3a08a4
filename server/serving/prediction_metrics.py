"""Prometheus text for the prediction service's /metrics (plain exposition format 0.0.4;
prometheus_client is not a dependency).

Per model and version: requests by status, rows predicted, request latency (histogram,
seconds, from the body read to the reply), and the merged batches the model ran (a
histogram of rows per forward pass: dynamic batching at work, and its forward time).
Counters start at zero when the server starts, as Prometheus expects.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # the last is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip([*self.buckets, float("inf")], self.counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative}')
        out.append(f"{name}_sum{{{labels}}} {self.total:.9g}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


@dataclass
class VersionMetrics:
    requests: Counter[int] = field(default_factory=Counter)  # by HTTP status
    rows: int = 0
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    batch_rows: Histogram = field(default_factory=lambda: Histogram(ROWS_BUCKETS))
    forward_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))


class ServingMetrics:
    """Thread-safe: the batchers' threads report forward passes, the event loop requests."""

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], VersionMetrics] = {}
        self._rejected: Counter[str] = Counter()  # before a version was chosen (auth, route)
        self._lock = threading.Lock()

    def _of(self, name: str, version: str) -> VersionMetrics:
        return self._versions.setdefault((name, version), VersionMetrics())

    def add_version(self, name: str, version: str) -> None:
        with self._lock:
            self._of(name, version)

    def request(self, name: str, version: str, status: int, rows: int, seconds: float) -> None:
        with self._lock:
            v = self._of(name, version)
            v.requests[status] += 1
            v.rows += rows
            v.latency.observe(seconds)

    def batch(self, name: str, version: str, rows: int, seconds: float) -> None:
        with self._lock:
            v = self._of(name, version)
            v.batch_rows.observe(rows)
            v.forward_seconds.observe(seconds)

    def reject(self, reason: str) -> None:
        with self._lock:
            self._rejected[reason] += 1

    def text(self) -> str:
        lines = [
            "# HELP fedveil_serve_requests_total Prediction requests by model, version, status.",
            "# TYPE fedveil_serve_requests_total counter",
        ]
        with self._lock:
            items = sorted(self._versions.items())
            for (name, version), v in items:
                for status, n in sorted(v.requests.items()):
                    labels = _labels(name, version) + f',code="{status}"'
                    lines.append(f"fedveil_serve_requests_total{{{labels}}} {n}")
            lines += [
                "# HELP fedveil_serve_rows_total Examples predicted.",
                "# TYPE fedveil_serve_rows_total counter",
            ]
            lines += [
                f"fedveil_serve_rows_total{{{_labels(n, ver)}}} {v.rows}" for (n, ver), v in items
            ]
            for metric, attr, help_text in (
                ("request_seconds", "latency", "Request latency, body read to reply."),
                ("batch_rows", "batch_rows", "Rows per forward pass (merged requests)."),
                ("forward_seconds", "forward_seconds", "Duration of each forward pass."),
            ):
                full = f"fedveil_serve_{metric}"
                lines += [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
                for (name, version), v in items:
                    lines += getattr(v, attr).lines(full, _labels(name, version))
            lines += [
                "# HELP fedveil_serve_rejected_total Requests refused before a model ran.",
                "# TYPE fedveil_serve_rejected_total counter",
            ]
            lines += [
                f'fedveil_serve_rejected_total{{reason="{r}"}} {n}'
                for r, n in sorted(self._rejected.items())
            ]
        return "\n".join(lines) + "\n"


def _labels(name: str, version: str) -> str:
    return f'model="{_escape(name)}",version="{_escape(version)}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
