"""The ledger's signed closing record binds the model file (`model_sha256`), and
`fedveil privacy verify RUN_DIR` holds model.safetensors to it. The adversary holds the
run directory: beside a genuinely signed ledger rolled back to its interruption record
(metrics, summary and report rolled back with it) he puts the longer-trained model. That
used to verify as interrupted; it fails now, naming both hashes. Runs in process: digits,
central DP, 3 rounds, Ctrl-C (KeyboardInterrupt) after round 2."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from fedveil.cli.main import main
from fedveil.config import RunConfig, load_config
from fedveil.privacy.dp import Ledger
from fedveil.server.engine.privacy_report import verify_run
from fedveil.simulations.simulate_run import simulate

SETTINGS = {
    "data.dataset": "digits",
    "model.name": "mlp",
    "data.num_clients": 10,
    "server.per_round": 4,
    "server.rounds": 3,
    "dp.mechanism": "central",
    "dp.epsilon": 8.0,
    "simulation.workers": 1,
}


def _config(out: Path) -> RunConfig:
    return load_config(None, {**SETTINGS, "out": str(out)})


def _ctrl_c_after(round_num: int) -> object:
    def hook(record: object) -> None:
        if getattr(record, "round", None) == round_num:
            raise KeyboardInterrupt

    return hook


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _closing(run: Path) -> dict:
    return json.loads((run / "privacy" / "ledger.jsonl").read_text().splitlines()[-1])


def _verify(run: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["privacy", "verify", str(run)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture(scope="module")
def interrupted_then_resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the run directory as Ctrl-C after round 2 left it, the same run resumed to 3)."""
    base = tmp_path_factory.mktemp("bound")
    out = base / "run"
    with pytest.raises(KeyboardInterrupt):
        simulate(_config(out), on_round=_ctrl_c_after(2))
    snapshot = Path(shutil.copytree(out, base / "at-interruption"))
    simulate(_config(out), resume=True)
    return snapshot, out


def test_an_interrupted_runs_model_is_bound_and_verifies(interrupted_then_resumed, capsys):
    snapshot, _ = interrupted_then_resumed
    closing = _closing(snapshot)
    assert closing["kind"] == "interrupted" and closing["training_round"] == 2
    assert closing["model_sha256"] == file_sha256(snapshot / "model.safetensors")
    code, said = _verify(snapshot, capsys)
    assert code == 3, said  # interrupted, and nothing beside the ledger disagrees
    assert "matches the closing record's model_sha256" in said, said


def test_the_finished_runs_model_is_bound_and_verifies(interrupted_then_resumed, capsys):
    _, finished = interrupted_then_resumed
    closing = _closing(finished)
    assert closing["kind"] == "final" and closing["training_round"] == 3
    assert closing["model_sha256"] == file_sha256(finished / "model.safetensors")
    code, said = _verify(finished, capsys)
    assert code == 0, said


def test_a_longer_trained_model_beside_the_rolled_back_ledger_fails(
    interrupted_then_resumed, tmp_path, capsys
):
    snapshot, finished = interrupted_then_resumed
    run = Path(shutil.copytree(snapshot, tmp_path / "run"))
    shutil.copy(finished / "model.safetensors", run / "model.safetensors")
    code, said = _verify(run, capsys)
    assert code == 1, said
    bound, shown = _closing(snapshot)["model_sha256"], file_sha256(run / "model.safetensors")
    assert bound != shown and bound in said and shown in said, said


def test_a_missing_model_file_fails_where_the_ledger_binds_one(
    interrupted_then_resumed, tmp_path, capsys
):
    run = Path(shutil.copytree(interrupted_then_resumed[0], tmp_path / "run"))
    (run / "model.safetensors").unlink()
    code, said = _verify(run, capsys)
    assert code == 1 and "model.safetensors: missing" in said, said


def test_a_closing_record_without_the_field_verifies_as_before_and_says_so(make_ledger, tmp_path):
    # An older ledger (or a run that bound no model): nothing to hold the file to.
    (tmp_path / "run" / "privacy").mkdir(parents=True)
    make_ledger(rounds=2, name="run/privacy/ledger.jsonl")
    (tmp_path / "run" / "model.safetensors").write_bytes(b"any model")
    result = verify_run(tmp_path / "run")
    assert result.ok, result.message
    assert "the model is not bound" in result.message, result.message


@pytest.mark.parametrize("value", ["0" * 63, "A" * 64, float("nan"), None, 7])
def test_the_ledger_refuses_a_model_hash_that_is_no_sha256(tmp_path, value):
    ledger = Ledger(tmp_path / "ledger.jsonl", run_id="run-1")
    with pytest.raises(ValueError, match="model_sha256"):
        ledger.close("interrupted", {"training_round": 0, "model_sha256": value})


def test_ctrl_c_during_an_evaluation_binds_the_kept_rounds_model(tmp_path, capsys):
    # Round 3 was released and its model stepped, then Ctrl-C during its evaluation: the
    # run publishes round 2's model (the checkpoint's), and the record binds that file.
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make_ctrl_c_in_eval_3",
            "data.num_clients": 6,
            "server.per_round": 3,
            "server.rounds": 5,
            "dp.mechanism": "central",
            "dp.epsilon": 50.0,
            "simulation.workers": 1,
            "simulation.plots": False,
            "out": str(tmp_path / "run"),
        },
    )
    with pytest.raises(KeyboardInterrupt):
        simulate(cfg)
    run = tmp_path / "run"
    closing = _closing(run)
    assert closing["kind"] == "interrupted" and closing["training_round"] == 3, closing
    with safe_open(str(run / "model.safetensors"), "pt") as model:
        assert model.metadata()["round"] == "2"
    assert closing["model_sha256"] == file_sha256(run / "model.safetensors")
    code, said = _verify(run, capsys)
    assert code == 3 and "matches the closing record's model_sha256" in said, said


def test_resuming_a_finished_run_keeps_its_model_bound(interrupted_then_resumed, tmp_path, capsys):
    # The ledger takes nothing after 'final'; the model file is written again, and must be
    # the same bytes (safetensors' header order is not fixed: model_file.py sorts it).
    run = Path(shutil.copytree(interrupted_then_resumed[1], tmp_path / "run"))
    simulate(_config(run), resume=True)
    assert _closing(run)["model_sha256"] == file_sha256(run / "model.safetensors")
    assert _verify(run, capsys)[0] == 0
