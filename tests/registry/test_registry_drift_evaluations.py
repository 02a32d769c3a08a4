"""A model retrained on drift from a DP version counts that version's drift evaluations: the
card's composed epsilon is the parent's, the evaluations' (composed by their accountant from
their signed ledgers) and its own; `fedveil privacy verify --card` recomputes it, and a card
leaving them out, or evaluations whose ledgers do not verify, are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedveil.cli.main import main
from fedveil.config import SecAggSection, load_config
from fedveil.privacy.dp import Ledger, compute_epsilon
from fedveil.privacy.dp.evaluation import ACCOUNTANT, EvaluationPlan
from fedveil.privacy.dp.ledger import parse_ledger_bytes
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.server.engine.secure_evaluation import evaluate_securely
from fedveil.server.registry import Registry, RegistryError
from fedveil.server.registry.drift_evaluations import DRIFT_EVALUATIONS_FILE, evaluations_record
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.tasks import make_task

DELTA = 1e-6


def evaluation_ledger(path: Path, version: str, run_id: str) -> list[dict]:
    """A real DP evaluation of a tiny model on 6 in-process devices; its ledger's entries."""
    overrides = {"model.task": "tiny_task:make", "data.num_clients": 6, "server.per_round": 6}
    task = make_task(load_config(None, overrides))
    plan = EvaluationPlan(1.0, DELTA, 2.0, 4.0)
    plan = EvaluationPlan(compute_epsilon([plan.event()], DELTA, ACCOUNTANT), DELTA, 2.0, 4.0)
    weights = torch.nn.utils.parameters_to_vector(task.model_fn().parameters()).detach()
    ledger = Ledger(path, run_id=run_id, signer=load_or_create_signer())
    with InProcessTransport(task) as transport:
        released = evaluate_securely(
            transport,
            range(6),
            weights,
            plan,
            SecAggSection(enabled=True),
            ledger,
            prior=[],
            budget=plan.epsilon,
            run_id=SIMULATION_RUN_ID,
            ledger_extra={"model_version": version},
        ).public
    assert released["released"] is True
    return parse_ledger_bytes(path.read_bytes())[0]


def _verify(run: Path, card: str, registry: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = main(["privacy", "verify", str(run), "--card", card, "--registry", str(registry)])
    captured = capsys.readouterr()
    return f"{code} {captured.out}{captured.err}"


def test_a_retrained_card_counts_the_drift_evaluations_that_led_to_it(
    tmp_path: Path, dp_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "reg"
    registry = Registry(root)
    parent = registry.register(dp_run, name="blobs")
    ledgers = [
        (f"eval{i}", evaluation_ledger(tmp_path / f"eval{i}.jsonl", parent.ref, f"eval{i}"))
        for i in range(2)
    ]
    retrain = tmp_path / "retrain"  # the retraining run: here the same DP run's files
    shutil.copytree(dp_run, retrain)
    (retrain / DRIFT_EVALUATIONS_FILE).write_text(evaluations_record(parent.ref, ledgers))

    child = registry.register(retrain, name="blobs", parent=parent.ref)
    lineage = child.card["lineage"]
    evaluations = lineage["drift_evaluations"]
    assert evaluations["runs"] == ["eval0", "eval1"] and evaluations["releases"] == 2
    events = [Ledger(tmp_path / f"eval{i}.jsonl").releases[0] for i in range(2)]
    single = events[0]["epsilon"]
    # Composed by the accountant: more than one evaluation, less than two added up.
    assert single < evaluations["epsilon"] < 2 * single
    assert evaluations["delta"] == DELTA
    eps = parent.card["privacy"]["epsilon"]
    assert lineage["composed"]["observers"] == pytest.approx(
        {
            "epsilon": 2 * eps + evaluations["epsilon"],
            "delta": 2 * parent.card["privacy"]["delta"] + DELTA,
        }
    )
    assert lineage["composed"]["coordinator"] is None  # central noise: a trusted curator
    assert _verify(retrain, "blobs@2", root, capsys).startswith("0 ")

    # A card that leaves the evaluations out claims less than the lineage cost: refused.
    card = json.loads(json.dumps(child.card))
    del card["lineage"]["drift_evaluations"]
    card["lineage"]["composed"]["observers"]["epsilon"] = 2 * eps
    (tmp_path / "card.json").write_text(json.dumps(card))
    output = _verify(retrain, str(tmp_path / "card.json"), root, capsys)
    assert output.startswith("1 ")
    assert "card field lineage.drift_evaluations.epsilon:" in output
    assert "card field lineage.composed.observers.epsilon:" in output

    # Evaluations of another version, or a ledger edited to cost less, are refused.
    (retrain / DRIFT_EVALUATIONS_FILE).write_text(evaluations_record("other@1", ledgers))
    with pytest.raises(RegistryError, match="evaluations of 'other@1'"):
        registry.register(retrain, name="blobs", parent=parent.ref)
    edited = json.loads(json.dumps(ledgers))
    edited[1][1][0]["epsilon"] = 0.01
    (retrain / DRIFT_EVALUATIONS_FILE).write_text(evaluations_record(parent.ref, edited))
    with pytest.raises(RegistryError, match="eval1's ledger does not verify"):
        registry.register(retrain, name="blobs", parent=parent.ref)
    assert "card field lineage.drift_evaluations" in _verify(retrain, "blobs@2", root, capsys)
