"""What a DP run publishes about time: nothing that depends on who took part.

A round lasts as long as its slowest sampled client, so under Poisson sampling the
round's duration correlates with the private cohort (0.64 with the cohort size, and
an AUC of 0.88 for whether one large client was sampled, on issue 28's runs). A
per-round time is therefore a release of the cohort that no epsilon accounts for,
whether it is published as a duration or derived from two published timestamps.

Under DP (central, distributed or DP-SGD):
- no round duration is published: `duration_s` goes to the private annex only
  (server/engine/round_record.py), and summary.json leaves out the run's `wall_s`;
- every published timestamp is the hour in which the writer opened (`PublicClock`):
  the ledger's entries (ledger.py), TensorBoard's event wall times and MLflow's
  metric timestamps and run start and end (server/engine/tracking.py). One value for
  the whole attempt, so no difference of two published times measures a round.

Why coarsen and not pad rounds to a fixed deadline: padding costs every round its
deadline in wall time, needs a deadline no honest round overruns (or an overrun is
itself the leak), and buys only the one channel that coarsening leaves, an observer
watching the publication as it happens (polling the API or the files while the run
runs), which stays outside the stated guarantee (docs/explanation/published-
statistics.md). Without DP nothing is private and real times are kept.
"""

from __future__ import annotations

import datetime as _dt
import math
import time

RESOLUTION_S = 3600  # published times are whole UTC hours


def coarse_seconds(now: float, resolution_s: int = RESOLUTION_S) -> float:
    """`now` (seconds since the epoch) truncated to a whole multiple of `resolution_s`."""
    if not math.isfinite(now):
        raise ValueError(f"now={now!r} is not a finite time")
    return float(math.floor(now / resolution_s) * resolution_s)


def iso_utc(seconds: float) -> str:
    """ISO 8601 in UTC, microseconds shown (the ledger's timestamp format)."""
    moment = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    return moment.isoformat(timespec="microseconds")


class PublicClock:
    """The time a writer publishes: under DP the hour it was opened in, whenever asked;
    without DP the real time."""

    def __init__(self, *, dp: bool, opened: float | None = None) -> None:
        self.dp = dp
        self.opened = time.time() if opened is None else float(opened)
        self._coarse = coarse_seconds(self.opened)

    def seconds(self) -> float:
        return self._coarse if self.dp else time.time()

    def millis(self) -> int:
        return int(self.seconds() * 1000)

    def iso(self) -> str:
        return iso_utc(self.seconds())
