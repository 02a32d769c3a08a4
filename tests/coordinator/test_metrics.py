"""/metrics text from run directories: incremental reads, resume truncation, epsilon."""

from __future__ import annotations

import json

from fedveil.server.coordinator.metrics import RoundsCache, ServiceCounters, privacy_figures, render


def write_rounds(path, rounds, dp="none", **extra):
    config = path.parent / "config.toml"
    if not config.exists():  # a run's resolved config says whether DP is on
        config.write_text(f'[dp]\nmechanism = "{dp}"\n')
    with path.open("a") as f:
        for r in rounds:
            rec = {
                "round": r,
                "applied": True,
                "dropped": 1,
                "cohort_aggregated": 4,
                "duration_s": 2.0,
                "test_accuracy": 0.5 + r / 100,
                "test_loss": 1.0 / r,
            }
            rec.update(extra)
            f.write(json.dumps(rec) + "\n")


def test_figures_are_read_incrementally_and_survive_truncation(tmp_path):
    cache = RoundsCache()
    metrics = tmp_path / "metrics.jsonl"
    assert cache.figures(tmp_path).rounds == 0
    write_rounds(metrics, [1, 2])
    fig = cache.figures(tmp_path)
    assert (fig.rounds, fig.dropped, fig.aggregated, fig.duration_sum) == (2, 2, 8, 4.0)
    with metrics.open("a") as f:
        f.write('{"round": 3, "applied": tr')  # being written right now
    assert cache.figures(tmp_path).rounds == 2
    metrics.write_text(metrics.read_text().rsplit("\n", 1)[0] + "\n")
    write_rounds(metrics, [3])
    assert cache.figures(tmp_path).rounds == 3 and cache.figures(tmp_path).test_accuracy == 0.53
    metrics.write_text("")  # resume truncated the file: start over
    write_rounds(metrics, [1])
    assert cache.figures(tmp_path).rounds == 1


def test_render_and_epsilon(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    write_rounds(run / "metrics.jsonl", [1, 2, 3], epsilon=0.7)
    (run / "privacy").mkdir()
    (run / "privacy" / "report.json").write_text(json.dumps({"epsilon": 0.9, "budget": 4.0}))
    cache = RoundsCache()
    assert privacy_figures(run, cache.figures(run)) == (0.7, 4.0)  # the round record wins
    counters = ServiceCounters()
    counters.reject("unauthorized")
    counters.fleet_bytes_in = 1234
    runs = [{"id": "r1", "status": "running", "bytes_sent": 10, "bytes_received": 20}]
    text = render(runs, {"r1": run}, cache, counters, clients_connected=5, superlink_up=True)
    for line in (
        'fedveil_rounds_completed_total{run="r1"} 3',
        'fedveil_client_dropouts_total{run="r1"} 3',
        'fedveil_epsilon_spent{run="r1"} 0.7',
        'fedveil_epsilon_budget{run="r1"} 4',
        'fedveil_round_duration_seconds_sum{run="r1"} 6',
        'fedveil_runs{status="running"} 1',
        "fedveil_clients_connected 5",
        "fedveil_fleet_bytes_received_total 1234",
        'fedveil_api_requests_rejected_total{reason="unauthorized"} 1',
    ):
        assert line in text.splitlines(), line
    assert "# TYPE fedveil_rounds_completed_total counter" in text
    (run / "privacy" / "report.json").write_text(
        json.dumps({"epsilon": 0.9, "budget": {"epsilon": 2}})
    )
    other = tmp_path / "r2"
    other.mkdir()
    (other / "privacy").mkdir()
    (other / "privacy" / "report.json").write_text((run / "privacy" / "report.json").read_text())
    assert privacy_figures(other, cache.figures(other)) == (0.9, 2.0)


def test_drops_by_reason_are_counted_per_check(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    write_rounds(run / "metrics.jsonl", [1], drops_by_reason={"norm_bound": 2, "nan": 1})
    write_rounds(run / "metrics.jsonl", [2], drops_by_reason={"norm_bound": 1})
    write_rounds(run / "metrics.jsonl", [3])  # a DP run's public record: no reasons
    cache = RoundsCache()
    assert cache.figures(run).drops_by_reason == {"norm_bound": 3, "nan": 1}
    runs = [{"id": "r1", "status": "running"}]
    text = render(runs, {"r1": run}, cache, ServiceCounters(), None, True).splitlines()
    assert 'fedveil_client_dropouts_by_reason_total{run="r1",reason="norm_bound"} 3' in text
    assert 'fedveil_client_dropouts_by_reason_total{run="r1",reason="nan"} 1' in text


def test_a_dp_run_shows_no_participation_counts_even_if_its_records_had_them(tmp_path):
    run = tmp_path / "dp"
    run.mkdir()
    write_rounds(run / "metrics.jsonl", [1, 2], dp="central", drops_by_reason={"nan": 1})
    fig = RoundsCache().figures(run)
    assert (fig.rounds, fig.dropped, fig.aggregated, dict(fig.drops_by_reason)) == (2, 0, 0, {})
    assert fig.test_accuracy == 0.52  # the server's own evaluation stays public
    nothing = tmp_path / "unknown"  # no config.toml: not known to be without DP
    nothing.mkdir()
    (nothing / "metrics.jsonl").write_text('{"round": 1, "dropped": 3}\n')
    assert RoundsCache().figures(nothing).dropped == 0
