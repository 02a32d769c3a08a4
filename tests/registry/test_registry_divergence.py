"""A diverged model is not registered without a word (issue 30): the coordinator's
automatic registration keeps a warning in the run's record (the dashboard marks the run
diverged), and registering one by hand prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.server.coordinator.model_versions import register_finished_run
from fedveil.server.registry import Registry
from fedveil.server.registry.divergence import divergence
from fedveil.simulations.simulate_run import simulate


@pytest.fixture(scope="module")
def swamped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose labels carry no signal: its model ends at chance level, as a diverged
    or DP-swamped one does (deterministically, where a swamped model's is random)."""
    out = tmp_path_factory.mktemp("diverged") / "run"
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make_unlearnable",
            "server.rounds": 2,
            "server.per_round": 6,
            "simulation.workers": 1,
            "simulation.plots": False,
            "out": str(out),
        },
    )
    simulate(cfg)
    return out


def test_the_coordinator_warns_when_it_registers_a_model_at_chance_level(swamped_run, tmp_path):
    # Used to register it without a word.
    record: dict = {"id": "run-1"}
    register_finished_run(tmp_path, swamped_run, record)
    assert record["model_version"] == "tiny-unlearnable@1"
    assert "the model diverged or learned nothing" in record["model_version_warning"]
    assert "chance level" in record["model_version_warning"]
    assert Registry(tmp_path / "registry").names() == ["tiny-unlearnable"]


def test_registering_a_diverged_model_by_hand_warns(swamped_run, tmp_path, capsys):
    code = main(["models", "register", str(swamped_run), "--registry", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 0
    assert "fedveil: warning:" in err and "learned nothing" in err


def test_chance_level_and_non_finite_losses_count_as_diverged():
    card = {"num_classes": 10, "central_evaluation": {"test_accuracy": 0.1, "test_loss": 2.3}}
    assert "chance level" in divergence(card)
    card["central_evaluation"] = {"test_accuracy": 0.6, "test_loss": float("nan")}
    assert "test loss is nan" in divergence(card)
    card["central_evaluation"] = {"test_accuracy": float("nan"), "test_loss": 1.0}
    assert divergence(card) is not None  # NaN fails the check closed
    card["central_evaluation"] = {"test_accuracy": 0.6, "test_loss": 1.0}
    assert divergence(card) is None
