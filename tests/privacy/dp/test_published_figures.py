"""`fedveil privacy verify RUN_DIR` against the holder of a run directory who leaves the
signed ledger alone and edits what a reader sees beside it: summary.json, report.json and
report.html claiming a smaller epsilon, or another run's files. Each used to verify OK."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fedveil.cli.main import main
from fedveil.server.engine.privacy_report import report_page

RUN = ["--dataset", "digits", "--clients", "10", "--per-round", "4", "--rounds", "3"]
DP = ["--dp", "central", "--epsilon", "8", "--set", "simulation.workers=1"]


def _simulate(out: Path, *extra: str) -> Path:
    assert main(["simulate", "--quiet", *RUN, *DP, *extra, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two small central-DP runs (the second with fixed-seed cohorts: a different epsilon)."""
    base = tmp_path_factory.mktemp("published")
    one = _simulate(base / "one")
    two = _simulate(base / "two", "--set", "dp.seeded_cohorts=true")
    return one, two


def _copy(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _verify(run: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["privacy", "verify", str(run)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _ledger_epsilon(run: Path) -> float:
    last = (run / "privacy" / "ledger.jsonl").read_text().splitlines()[-1]
    return float(json.loads(last)["epsilon"])


def test_the_untouched_run_and_its_regenerated_report_verify(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)
    assert _verify(run, capsys)[0] == 0
    assert main(["privacy", "report", str(run)]) == 0
    code, said = _verify(run, capsys)
    assert code == 0, said


def test_a_lowered_epsilon_in_summary_json_fails_naming_the_field(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)
    _edit_json(run / "summary.json", lambda s: s.update(epsilon=1.0))
    code, said = _verify(run, capsys)
    assert code == 1
    assert "summary.json: epsilon = 1.0" in said and repr(_ledger_epsilon(run)) in said


@pytest.mark.parametrize("value", [float("nan"), "1.0", None])
def test_a_summary_epsilon_that_is_no_number_fails(runs, tmp_path, capsys, value):
    run = _copy(runs[0], tmp_path)
    path = run / "summary.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"epsilon": value}))
    code, said = _verify(run, capsys)
    assert code == 1 and "summary.json: epsilon" in said


def test_a_lowered_epsilon_in_report_json_fails_naming_the_fields(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)

    def lower(report: dict) -> None:
        report["epsilon"] = 1.0
        report["budget_remaining"] = report["budget_epsilon"] - 1.0
        report["adversaries"]["observers"]["epsilon"] = 1.0

    _edit_json(run / "privacy" / "report.json", lower)
    code, said = _verify(run, capsys)
    assert code == 1
    for field in ("epsilon = 1.0", "budget_remaining = ", "adversaries.observers.epsilon = 1.0"):
        assert f"report.json: {field}" in said, said


def test_a_shortened_epsilon_series_in_report_json_fails(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)

    def drop_last_round(report: dict) -> None:
        for values in report["series"].values():
            values.pop()

    _edit_json(run / "privacy" / "report.json", drop_last_round)
    code, said = _verify(run, capsys)
    assert code == 1 and "report.json: series.epsilon = " in said


def test_an_edited_report_html_fails(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)
    page = run / "privacy" / "report.html"
    shown = f"{_ledger_epsilon(run):.3f}"
    assert shown in page.read_text()
    page.write_text(page.read_text().replace(shown, "1.000"))
    code, said = _verify(run, capsys)
    assert code == 1 and "report.html: differs from the page report.json renders to" in said


def test_a_report_html_without_its_report_json_fails(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)
    (run / "privacy" / "report.json").unlink()
    code, said = _verify(run, capsys)
    assert code == 1 and "report.html: no report.json beside it" in said


def test_another_runs_summary_fails(runs, tmp_path, capsys):
    # Both runs verify and both are signed by the same operator's key; run two's summary
    # states its own (different) epsilon.
    run = _copy(runs[0], tmp_path)
    shutil.copy(runs[1] / "summary.json", run / "summary.json")
    code, said = _verify(run, capsys)
    assert code == 1 and "summary.json: epsilon = " in said


def test_an_edited_verification_status_in_report_json_fails(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)
    _edit_json(
        run / "privacy" / "report.json", lambda r: r["verification"].update(status="interrupted")
    )
    code, said = _verify(run, capsys)
    assert code == 1 and 'verification.status = "interrupted"' in said


def test_a_verifiers_message_edited_and_the_page_rendered_from_it_fails(runs, tmp_path, capsys):
    # The page shows the message ("Verified: ... epsilon 7.99 <= budget 8"): rewriting it
    # and rendering the page from the edited JSON keeps page and JSON in step.
    run = _copy(runs[0], tmp_path)
    privacy = run / "privacy"
    shown = f"epsilon {_ledger_epsilon(run):.6g}"

    def claim_less(report: dict) -> None:
        assert shown in report["verification"]["message"]
        report["verification"]["message"] = report["verification"]["message"].replace(
            shown, "epsilon 1"
        )

    _edit_json(privacy / "report.json", claim_less)
    report = json.loads((privacy / "report.json").read_text())
    (privacy / "report.html").write_text(report_page(report, privacy))
    code, said = _verify(run, capsys)
    assert code == 1 and "report.json: verification.message = " in said, said


def test_another_runs_ledger_and_report_fail(runs, tmp_path, capsys):
    # The other run's ledger verifies on its own (same operator, same key) and its report
    # is anchored in it; the summary beside them is this run's.
    run = _copy(runs[0], tmp_path)
    shutil.copytree(runs[1] / "privacy", run / "privacy", dirs_exist_ok=True)
    code, said = _verify(run, capsys)
    assert code == 1 and "summary.json: epsilon = " in said


def test_an_empty_witness_file_fails_rather_than_checking_nothing(runs, tmp_path, capsys):
    run = _copy(runs[0], tmp_path)
    witness = tmp_path / "witness.jsonl"
    witness.write_text("\n")
    capsys.readouterr()
    code = main(["privacy", "verify", str(run), "--witness", str(witness)])
    said = capsys.readouterr().err
    assert code == 1 and f"witness file {witness}: holds no ledger head" in said


def test_a_lowered_epsilon_in_metrics_jsonl_fails_naming_the_round(runs, tmp_path, capsys):
    # epsilon.png is drawn from these rows: the plot an auditor looks at first.
    run = _copy(runs[0], tmp_path)
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["epsilon"] = rows[0]["epsilon"] / 2
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, said = _verify(run, capsys)
    assert code == 1 and "metrics.jsonl line 2: round 2 epsilon = " in said, said


def test_a_metrics_round_past_the_ledgers_closing_record_fails(runs, tmp_path, capsys):
    # A ledger rolled back to an older signed record beside the rounds trained after it.
    run = _copy(runs[0], tmp_path)
    path = run / "metrics.jsonl"
    last = json.loads(path.read_text().splitlines()[-1])
    path.write_text(path.read_text() + json.dumps(last | {"round": last["round"] + 1}) + "\n")
    code, said = _verify(run, capsys)
    assert code == 1 and "but the ledger closes at training round 3" in said, said


def test_a_model_file_swapped_from_another_run_fails_naming_both_hashes(runs, tmp_path, capsys):
    # The ledger's closing record binds model.safetensors (model_sha256).
    run = _copy(runs[0], tmp_path)
    shutil.copy(runs[1] / "model.safetensors", run / "model.safetensors")
    bound = json.loads((run / "privacy" / "ledger.jsonl").read_text().splitlines()[-1])
    code, said = _verify(run, capsys)
    assert code == 1, said
    assert bound["model_sha256"] in said, said
    assert hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest() in said, said
