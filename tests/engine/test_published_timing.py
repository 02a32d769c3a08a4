"""Under DP nothing published measures a round's duration (issue 28, "Round duration
leaks the cohort"): a round lasts as long as its slowest sampled client, so under Poisson
sampling its duration reveals the private cohort. The observer here reads what a DP run
publishes (metrics.jsonl, summary.json, the signed ledger, TensorBoard's event files
with TensorBoard's own reader, the MLflow store with MlflowClient) and tries to derive
each round's duration: every source must give none, or zero."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path

from fedveil.privacy.dp.public_time import RESOLUTION_S, PublicClock, coarse_seconds
from fedveil.server.engine.round_record import PUBLIC_UNDER_DP
from fedveil.simulations.simulate_run import simulate
from tests.engine.test_tracking import (
    event_accumulator,
    metrics_lines,
    only_mlflow_run,
    tracked_config,
)

ROUNDS = 4


def _central_dp_poisson(tmp_path: Path):
    return tracked_config(
        tmp_path,
        **{
            "server.rounds": ROUNDS,
            "server.sampling": "poisson",
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "dp.clip": 0.5,
            "dp.noise_multiplier": 3.0,
        },
    )


def _differences(times: list[float]) -> set[float]:
    return {b - a for a, b in itertools.pairwise(times)}


def test_a_dp_run_publishes_no_timing_that_depends_on_who_took_part(tmp_path):
    cfg = _central_dp_poisson(tmp_path)
    simulate(cfg)
    run = Path(cfg.out)

    # metrics.jsonl and summary.json: no duration, no wall time. The operator keeps them.
    lines = metrics_lines(cfg)
    assert len(lines) == ROUNDS
    assert not any("duration_s" in line for line in lines)
    assert "duration_s" not in PUBLIC_UNDER_DP
    summary = json.loads((run / "summary.json").read_text())
    assert not {"wall_s", "attempt_wall_s"} & set(summary)
    private = [json.loads(x) for x in (run / "private" / "rounds.jsonl").read_text().splitlines()]
    assert all(r["duration_s"] > 0 for r in private if "cohort" in r)

    # The signed ledger: one timestamp for every entry, a whole UTC hour.
    entries = [json.loads(x) for x in (run / "privacy" / "ledger.jsonl").read_text().splitlines()]
    stamps = {entry["timestamp"] for entry in entries}
    assert len(entries) >= ROUNDS and len(stamps) == 1
    (stamp,) = stamps
    assert datetime.fromisoformat(stamp).timestamp() % RESOLUTION_S == 0

    # TensorBoard's event files, read with TensorBoard's own accumulator.
    (run_dir,) = [d for d in (tmp_path / "tb").iterdir() if d.is_dir()]  # the run's own
    acc = event_accumulator.EventAccumulator(str(run_dir))
    acc.Reload()
    walls = [e.wall_time for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    assert len(walls) >= ROUNDS
    assert _differences(sorted(walls)) <= {0.0}
    assert walls[0] % RESOLUTION_S == 0

    # The MLflow store: metric timestamps, and the run's start and end.
    client, mlrun = only_mlflow_run(tmp_path / "mlruns")
    history = client.get_metric_history(mlrun.info.run_id, "epsilon")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, ROUNDS + 1))
    times = {
        m.timestamp
        for key in mlrun.data.metrics
        for m in client.get_metric_history(mlrun.info.run_id, key)
    }
    assert times == {mlrun.info.start_time} == {mlrun.info.end_time}
    assert mlrun.info.start_time % (RESOLUTION_S * 1000) == 0

    # The privacy report's list of published statistics says so (JSON and HTML).
    report = json.loads((run / "privacy" / "report.json").read_text())
    stated = {item["name"]: item["protection"] for item in report["published_statistics"]}
    duration = stated["round duration (duration_s), the run's wall time (wall_s)"]
    assert duration.startswith("private annex only, not published")
    stamps_line = next(p for n, p in stated.items() if n.startswith("timestamps (ledger"))
    assert "the UTC hour its writer opened in" in stamps_line
    html = (run / "privacy" / "report.html").read_text()
    assert "round duration (duration_s)" in html and "timestamps (ledger entries" in html


def test_the_public_clock_coarsens_only_under_dp():
    opened = 1_750_000_123.456
    dp = PublicClock(dp=True, opened=opened)
    assert dp.seconds() == coarse_seconds(opened) == 1_749_999_600.0
    assert dp.millis() == 1_749_999_600_000
    assert dp.iso() == "2025-06-15T15:00:00.000000+00:00"
    real = PublicClock(dp=False, opened=opened)
    assert real.seconds() > opened  # the real time, now
