"""Membership inference and model inversion against a run's final model, as an attacker runs
them: `fedveil privacy attack membership|model-inversion`, and the ROC arithmetic they rest on."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.simulations.attacks.membership import train_in_simulation
from fedveil.simulations.attacks.model_inversion import (
    InversionSettings,
    class_confidence,
    invert_class,
    invert_run,
    load_run_model,
)
from fedveil.simulations.attacks.roc import (
    Roc,
    bound_tpr,
    bound_violations,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from fedveil.tasks import make_task

PNG = b"\x89PNG\r\n\x1a\n"

# Deliberately overfit: 15 member clients of about 18 digits each, every one in every
# round, 20 local epochs. The dataset is split into 4 * 15 clients (members, held out,
# shadow pool), IID so every client has data.
OVERFIT = {
    "data.dataset": "digits",
    "data.partition": "iid",
    "model.name": "mlp",
    "data.num_clients": 15,
    "server.per_round": 15,
    "server.rounds": 4,
    "client.local_epochs": 20,
    "client.lr": 0.1,
    "eval.central_every": 0,
    "device": "cpu",
}


def _toml(values: dict[str, object]) -> str:
    sections: dict[str, dict[str, object]] = {}
    top: dict[str, object] = {}
    for key, value in values.items():
        section, _, name = key.rpartition(".")
        (sections.setdefault(section, {}) if section else top)[name] = value
    lines = [f"{k} = {json.dumps(v)}" for k, v in top.items()]
    for section, items in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in items.items()]
    return "\n".join(lines) + "\n"


def test_auc_and_roc_match_the_pairwise_definition():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.6, 0.2])
    members = np.array([1, 0, 1, 1, 0, 0], dtype=bool)
    pairs = [
        1.0 if a > b else 0.5 if a == b else 0.0
        for a, b in itertools.product(scores[members], scores[~members])
    ]
    assert roc_auc(scores, members) == pytest.approx(np.mean(pairs))
    assert roc_auc(scores, members) == pytest.approx(6.5 / 9)
    roc = roc_curve(scores, members)
    # the tie at 0.6 moves one member and one non-member together
    assert roc.fpr == pytest.approx([0, 0, 1 / 3, 1 / 3, 2 / 3, 1])
    assert roc.tpr == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 1, 1])
    assert tpr_at_fpr(roc, 0.01) == pytest.approx(1 / 3)
    assert roc_auc(-scores, members) == pytest.approx(1 - 6.5 / 9)
    with pytest.raises(ValueError, match="non-members"):
        roc_auc(scores, np.ones(6, dtype=bool))


def test_the_bound_check_flags_an_roc_above_what_epsilon_allows():
    eps, delta = 1.0, 1e-5
    # 50% TPR at 1% FPR: e^1 * 0.01 + 1e-5 allows 2.7%; measured on 1,000 of each
    fabricated = Roc(np.array([0.0, 0.01, 0.5, 1.0]), np.array([0.0, 0.5, 0.95, 1.0]), 1000, 1000)
    check = bound_violations(fabricated, eps, delta)
    flagged = {(p["fpr"], p["tpr"]) for p in check.points}
    assert (0.01, 0.5) in flagged
    # the complementary test: 1 - FPR <= e^eps * (1 - TPR) + delta caps TPR at 0.82 here
    assert (0.5, 0.95) in flagged
    assert len(check.significant) == 2
    assert check.to_json()["violations"] == 2
    # chance, and a curve on the bound itself, are within it
    grid = np.linspace(0, 1, 101)
    assert not bound_violations(Roc(grid, grid, 1000, 1000), eps, delta).points
    on_bound = bound_tpr(grid, eps, delta)
    assert not bound_violations(Roc(grid, on_bound, 1000, 1000), eps, delta).points
    # one member ranked first of 20 is above the bound, but 1 of 20 is no evidence
    small = Roc(np.array([0.0, 0.0, 1.0]), np.array([0.0, 0.05, 1.0]), 20, 20)
    small_check = bound_violations(small, eps, delta)
    assert len(small_check.points) == 1 and not small_check.significant


def test_membership_cli_beats_chance_on_an_overfit_config(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(_toml(OVERFIT))
    out = tmp_path / "mia"
    code = main(
        [
            "privacy",
            "attack",
            "membership",
            "--config",
            str(config),
            "--shadows",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads((out / "membership.json").read_text())
    run = result["runs"]["nondp"]
    assert result["level"] == "client" and run["epsilon"] is None
    assert run["members"] == run["non_members"] == 15
    assert run["attacks"]["loss"]["auc"] >= 0.6
    assert run["attacks"]["lira"]["auc"] >= 0.6
    assert (out / result["roc_image"]).read_bytes().startswith(PNG)
    assert "loss: AUC" in capsys.readouterr().out
    # the target trained on the members only: its population is data.num_clients
    target_config = (out / "runs" / "nondp" / "target" / "config.toml").read_text()
    assert "num_clients = 15" in target_config


def _trained_run(tmp_path):
    cfg = load_config(None, {**OVERFIT, "server.rounds": 2, "client.local_epochs": 5})
    task = make_task(cfg)
    train_in_simulation(cfg, task, tmp_path / "run", seed=0)
    return tmp_path / "run", task


def test_model_inversion_raises_the_target_class_confidence(tmp_path):
    run_dir, task = _trained_run(tmp_path)
    run = load_run_model(run_dir)
    assert run.input_shape == task.input_shape and run.num_classes == 10
    x_test = task.test_data[0]
    lo, hi = float(x_test.min()), float(x_test.max())
    x, start, end = invert_class(run.model, 3, run.input_shape, lo, hi)
    assert end > start and end > 0.9
    assert float(x.min()) >= lo and float(x.max()) <= hi  # projected into the data range
    assert class_confidence(run.model, x, 3) == pytest.approx(end)
    report = invert_run(
        run_dir, tmp_path / "inv", value_range=(lo, hi), settings=InversionSettings(steps=60)
    )
    assert [r["class"] for r in report["classes"]] == list(range(10))
    assert all(r["final_confidence"] > r["start_confidence"] for r in report["classes"])
    assert (tmp_path / "inv" / "model_inversion.png").read_bytes().startswith(PNG)


def test_an_attack_on_a_run_without_its_model_names_the_file(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        invert_run(tmp_path, tmp_path / "out")
    code = main(["privacy", "attack", "model-inversion", str(tmp_path), "--out", str(tmp_path)])
    assert code != 0
    assert str(tmp_path / "model.safetensors") in capsys.readouterr().err


def test_model_inversion_reads_the_range_from_the_run_config(tmp_path, capsys):
    run_dir, task = _trained_run(tmp_path)
    code = main(
        [
            "privacy",
            "attack",
            "model-inversion",
            str(run_dir),
            "--out",
            str(tmp_path / "inv"),
            "--steps",
            "30",
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "inv" / "model_inversion.json").read_text())
    x = task.test_data[0]
    assert report["range"] == pytest.approx([float(x.min()), float(x.max())])
    assert "class 9: confidence" in capsys.readouterr().out
    (run_dir / "config.toml").unlink()
    with pytest.raises(FileNotFoundError, match=r"config\.toml"):
        invert_run(run_dir, tmp_path / "inv2")
