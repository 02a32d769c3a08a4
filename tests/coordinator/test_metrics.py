"""/metrics text from run directories: incremental reads, resume truncation, epsilon."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from registry_runs import tiny_run

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
    # No signed ledger: neither the round records nor report.json is an epsilon.
    assert privacy_figures(run, running=False) == (None, None)
    counters = ServiceCounters()
    counters.reject("unauthorized")
    counters.fleet_bytes_in = 1234
    runs = [{"id": "r1", "status": "running", "bytes_sent": 10, "bytes_received": 20}]
    text = render(runs, {"r1": run}, cache, counters, clients_connected=5, superlink_up=True)
    for line in (
        'fedveil_rounds_completed_total{run="r1"} 3',
        'fedveil_client_dropouts_total{run="r1"} 3',
        'fedveil_round_duration_seconds_sum{run="r1"} 6',
        'fedveil_runs{status="running"} 1',
        "fedveil_clients_connected 5",
        "fedveil_fleet_bytes_received_total 1234",
        'fedveil_api_requests_rejected_total{reason="unauthorized"} 1',
    ):
        assert line in text.splitlines(), line
    assert "# TYPE fedveil_rounds_completed_total counter" in text
    assert 'fedveil_epsilon_spent{run="r1"}' not in text


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


@pytest.fixture(scope="module")
def signed_dp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished central-DP tiny run: a real signed ledger (tests work on copies)."""
    return tiny_run(tmp_path_factory.mktemp("runs") / "dp", dp=True)


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def test_epsilon_is_what_the_signed_ledger_proves_not_report_json(
    tmp_path: Path, signed_dp_run: Path
) -> None:
    """/metrics took report.json's epsilon (and the round records') as written: an
    operator, or anyone who can write the state directory, lowered it by editing a file.
    Now only the ledger's verified figures are exposed."""
    run = _copy(signed_dp_run, tmp_path / "r1")
    ledger = [
        json.loads(line) for line in (run / "privacy" / "ledger.jsonl").read_text().splitlines()
    ]
    spent = [e["epsilon"] for e in ledger if e.get("kind") == "release"][-1]
    budget = next(e["budget_epsilon"] for e in ledger if e.get("kind") == "release")
    assert 0 < spent <= budget
    report = run / "privacy" / "report.json"
    report.write_text(json.dumps({**json.loads(report.read_text()), "epsilon": 0.001}))
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"round": 99, "status": "applied", "epsilon": 0.001}) + "\n")
    cache = RoundsCache()
    runs = [{"id": "r1", "status": "completed"}]
    text = render(runs, {"r1": run}, cache, ServiceCounters(), None, True).splitlines()
    assert f'fedveil_epsilon_spent{{run="r1"}} {spent:g}' in text
    assert f'fedveil_epsilon_budget{{run="r1"}} {budget:g}' in text

    # A ledger edited to a lower epsilon fails its hash chain: no figure at all, not the
    # smaller one; the same for a finished run's ledger with its last lines cut off.
    edited = _copy(signed_dp_run, tmp_path / "edited")
    path = edited / "privacy" / "ledger.jsonl"
    path.write_text(path.read_text().replace(f'"epsilon":{spent}', '"epsilon":0.001', 1))
    assert path.read_text() != (run / "privacy" / "ledger.jsonl").read_text()
    assert privacy_figures(edited, running=False) == (None, None)
    cut = _copy(signed_dp_run, tmp_path / "cut")
    path = cut / "privacy" / "ledger.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-2]))
    assert privacy_figures(cut, running=False) == (None, None)
    # While the run is going its ledger is not closed yet: the releases so far count.
    first = [e["epsilon"] for e in ledger[: len(lines) - 2] if e.get("kind") == "release"]
    assert privacy_figures(cut, running=True) == (first[-1] if first else 0.0, budget)
