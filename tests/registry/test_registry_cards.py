"""Model cards against the adversary: a card cannot claim less than the signed ledger
allows, a DP run's card carries no statistics of clients' data, and the lineage's
composed epsilon is checked too (`fedveil privacy verify RUN_DIR --card`)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from registry_runs import tiny_run

from fedveil.cli.main import main
from fedveil.privacy.dp.ledger import parse_ledger_bytes
from fedveil.server.registry import Registry, RegistryError

CLIENT_KEYS = ("clients", "per_round", "federated_accuracy", "partition", "examples", "cohort")


def _ledger(run: Path) -> list[dict[str, Any]]:
    return parse_ledger_bytes((run / "privacy" / "ledger.jsonl").read_bytes())[0]


def _verify(
    run: Path, card: str, registry: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["privacy", "verify", str(run), "--card", card, "--registry", str(registry)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_dp_card_states_the_ledger_and_no_client_statistics(
    tmp_path: Path, dp_run: Path, plain_run: Path
) -> None:
    registry = Registry(tmp_path / "reg")
    card = registry.register(dp_run).card
    ledger = _ledger(dp_run)
    last_release = [e for e in ledger if e.get("kind") == "release"][-1]
    privacy = card["privacy"]
    assert privacy["dp"] == "central_gaussian"
    assert (
        privacy["epsilon"]
        == last_release["epsilon"]
        == privacy["adversaries"]["observers"]["epsilon"]
    )
    assert privacy["adversaries"]["observers"]["accountant"] == last_release["accountant"]
    assert privacy["adversaries"]["coordinator"]["epsilon"] is None  # a trusted curator
    assert "trusted curator" in privacy["adversaries"]["coordinator"]["statement"]
    assert privacy["ledger"]["head_hash"] == ledger[-1]["hash"]
    assert privacy["ledger"]["head_signature"] == ledger[-1]["signature"]
    assert privacy["ledger"]["state"] == "final"
    assert card["central_evaluation"]["test_accuracy"] is not None
    assert card["secure_aggregation"] == "off" and card["rounds"] == 2
    # Under DP nothing computed from clients' data or revealing participation.
    assert card["client_data"] is None
    text = json.dumps(card)
    for key in CLIENT_KEYS:
        assert f'"{key}"' not in text, key
    # Without DP the card shows them, and says it has no guarantee.
    plain = registry.register(plain_run).card
    assert plain["client_data"]["clients"] == 6 and plain["client_data"]["per_round"] == 3
    assert plain["privacy"]["epsilon"] is None
    assert "No differential privacy" in plain["privacy"]["statement"]


def test_a_card_claiming_less_than_the_ledger_fails_verify(
    tmp_path: Path, dp_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "reg"
    version = Registry(root).register(dp_run, name="blobs")
    assert _verify(dp_run, "blobs@1", root, capsys)[0] == 0

    def edited(name: str, change: Any) -> str:
        card = json.loads(json.dumps(version.card))
        change(card)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(card))
        return str(path)

    def smaller(card: dict[str, Any]) -> None:
        card["privacy"]["epsilon"] /= 2
        card["privacy"]["adversaries"]["observers"]["epsilon"] /= 2

    def other_head(card: dict[str, Any]) -> None:
        card["privacy"]["ledger"]["head_hash"] = "0" * 64

    def with_counts(card: dict[str, Any]) -> None:
        card["client_data"] = {"clients": 6}

    def no_dp(card: dict[str, Any]) -> None:
        card["privacy"] = {"dp": "none", "epsilon": None, "delta": None}

    for name, change, field in [
        ("smaller", smaller, "privacy.epsilon"),
        ("head", other_head, "privacy.ledger.head_hash"),
        ("counts", with_counts, "client_data"),
        ("no-dp", no_dp, "privacy.dp"),
    ]:
        code, output = _verify(dp_run, edited(name, change), root, capsys)
        assert code == 1, name
        assert f"card field {field}:" in output, (name, output)

    # The same edit made to the registry's own card is caught through the reference.
    card_file = version.model_path.parent / "card.json"
    card = json.loads(card_file.read_text())
    smaller(card)
    card_file.write_text(json.dumps(card))
    code, output = _verify(dp_run, "blobs@1", root, capsys)
    assert code == 1 and "card field privacy.adversaries.observers.epsilon:" in output


def test_a_stale_report_cannot_lower_a_new_card(tmp_path: Path, dp_run: Path) -> None:
    """Figures on a card come from the verified ledger, not from report.json; a report.json
    that states less than its ledger proves is refused by verification (it used to register
    with the ledger's figures, the edited report left beside it)."""
    run = Path(shutil.copytree(dp_run, tmp_path / "run"))
    card = Registry(tmp_path / "honest").register(run).card
    assert card["privacy"]["adversaries"]["observers"]["epsilon"] == _ledger(run)[-2]["epsilon"]
    report_path = run / "privacy" / "report.json"
    report = json.loads(report_path.read_text())
    report["adversaries"]["observers"]["epsilon"] = 0.01
    report_path.write_text(json.dumps(report))
    with pytest.raises(RegistryError, match=r"report.json: adversaries.observers.epsilon = 0.01"):
        Registry(tmp_path / "reg").register(run)


def test_a_run_whose_ledger_fails_verification_is_not_registered(
    tmp_path: Path, dp_run: Path
) -> None:
    run = Path(shutil.copytree(dp_run, tmp_path / "run"))
    ledger = run / "privacy" / "ledger.jsonl"
    ledger.write_bytes(b"".join(ledger.read_bytes().splitlines(keepends=True)[:-1]))
    (run / "privacy" / "report.json").unlink()  # the truncation attack of issue 16
    with pytest.raises(RegistryError, match="fails verification"):
        Registry(tmp_path / "reg").register(run)


def test_lineage_composes_epsilon_and_verify_checks_it(
    tmp_path: Path, dp_run: Path, plain_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "reg"
    registry = Registry(root)
    parent = registry.register(dp_run, name="blobs")
    child = registry.register(dp_run, name="blobs", parent="blobs@1")
    eps, delta = parent.card["privacy"]["epsilon"], parent.card["privacy"]["delta"]
    lineage = child.card["lineage"]
    assert lineage["parent"] == "blobs@1" and lineage["same_users"] is True
    assert lineage["composed"]["observers"] == pytest.approx(
        {"epsilon": 2 * eps, "delta": 2 * delta}
    )
    assert lineage["composed"]["coordinator"] is None  # central DP: no guarantee against it
    grandchild = registry.register(dp_run, name="blobs", parent="blobs@2")
    assert grandchild.card["lineage"]["chain"] == ["blobs@1", "blobs@2"]
    assert grandchild.card["lineage"]["composed"]["observers"]["epsilon"] == pytest.approx(3 * eps)
    disjoint = registry.register(dp_run, name="blobs", parent="blobs@1", same_users=False)
    assert disjoint.card["lineage"]["composed"]["observers"]["epsilon"] == pytest.approx(eps)
    # A model trained on from a model without DP carries no guarantee at all.
    plain = registry.register(plain_run, name="plain")
    after_plain = registry.register(dp_run, name="blobs", parent=plain.ref)
    assert after_plain.card["lineage"]["composed"]["observers"] is None

    assert _verify(dp_run, "blobs@2", root, capsys)[0] == 0
    card = json.loads(json.dumps(child.card))
    card["lineage"]["composed"]["observers"]["epsilon"] = eps  # claims no composition
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    code, output = _verify(dp_run, str(path), root, capsys)
    assert code == 1 and "card field lineage.composed.observers.epsilon:" in output

    with pytest.raises(RegistryError, match="'blobs@9'"):
        registry.register(dp_run, name="blobs", parent="blobs@9")


def test_distributed_dp_card_states_the_coordinator_bound_and_verify_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tiny_run(tmp_path / "ddp", dp=False, distributed=True)
    root = tmp_path / "reg"
    card = Registry(root).register(run, name="ddp").card
    privacy = card["privacy"]
    coordinator = privacy["adversaries"]["coordinator"]
    assert privacy["dp"] == "distributed_skellam" and card["secure_aggregation"] == "semi_honest"
    # Unamplified against the coordinator: above the observers' amplified figure.
    assert coordinator["epsilon_bound"] > privacy["epsilon"] > 0
    assert "epsilon_max" not in coordinator and "distribution" not in coordinator
    assert _verify(run, "ddp@1", root, capsys)[0] == 0
    card["privacy"]["adversaries"]["coordinator"]["epsilon_bound"] = privacy["epsilon"]
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    code, output = _verify(run, str(path), root, capsys)
    assert code == 1 and "card field privacy.adversaries.coordinator.epsilon_bound:" in output


def test_a_run_started_from_a_version_carries_it(
    tmp_path: Path, dp_run: Path, plain_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`simulate --init-model name@version`: lineage.json names the start; registering the
    run finds its parent by the model's SHA-256, and a card hiding it fails verify."""
    root = tmp_path / "reg"
    registry = Registry(root)
    parent = registry.register(dp_run, name="blobs")
    child_run = tiny_run(
        tmp_path / "child", dp=True, init_model=parent.model_path, init_ref=parent.ref
    )
    assert json.loads((child_run / "lineage.json").read_text())["parent"] == "blobs@1"
    other = registry.register(dp_run, name="other")  # same model bytes, another name
    child = registry.register(child_run, name="blobs")
    lineage = child.card["lineage"]
    assert lineage["parent"] == "blobs@1"
    assert lineage["composed"]["observers"]["epsilon"] == pytest.approx(
        parent.card["privacy"]["epsilon"] + child.card["privacy"]["epsilon"]
    )
    assert _verify(child_run, "blobs@2", root, capsys)[0] == 0

    card = json.loads(json.dumps(child.card))
    card["lineage"] = None  # the cheaper-looking card: no parent, no composition
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    code, output = _verify(child_run, str(path), root, capsys)
    assert code == 1 and "card field lineage:" in output

    with pytest.raises(RegistryError, match="not the one the run started from"):
        registry.register(child_run, parent=registry.register(plain_run, name="p").ref)
    assert registry.register(child_run, parent=other.ref).card["lineage"]["parent"] == "other@1"

    # A start outside the registry: no composed figure is claimed.
    outside = tiny_run(tmp_path / "outside", dp=True, init_model=plain_run / "model.safetensors")
    lineage = Registry(tmp_path / "fresh").register(outside).card["lineage"]
    assert lineage["parent"] is None and lineage["composed"] == {
        "observers": None,
        "coordinator": None,
    }


def test_the_card_records_the_ledger_bound_model_and_a_swapped_model_is_refused(
    tmp_path: Path, dp_run: Path, plain_run: Path
) -> None:
    # The ledger's closing record binds model.safetensors (model_sha256): the card says so.
    registry = Registry(tmp_path / "reg")
    card = registry.register(dp_run).card
    bound = _ledger(dp_run)[-1]["model_sha256"]
    assert card["privacy"]["ledger"]["model_sha256"] == bound == card["source"]["model_sha256"]
    # Another model beside the same ledger is not registered as the run's.
    run = Path(shutil.copytree(dp_run, tmp_path / "swapped"))
    shutil.copy(plain_run / "model.safetensors", run / "model.safetensors")
    other = hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()
    with pytest.raises(RegistryError) as refused:
        registry.register(run)
    assert bound in str(refused.value) and other in str(refused.value), refused.value
