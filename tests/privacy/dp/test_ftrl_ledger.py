"""DP-FTRL releases in the signed ledger: `privacy verify` recomputes the sensitivity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedveil.privacy.dp import Ledger
from fedveil.privacy.dp.ftrl import ParticipationSchema, TreeFactorization
from fedveil.privacy.dp.ftrl.ftrl_accounting import epsilon_after
from fedveil.privacy.dp.ftrl.ledger_fields import ftrl_entry_fields
from fedveil.privacy.dp.ftrl.optimize import banded_factorization
from fedveil.privacy.dp.ledger import canonical_json, entry_hash, signed_message
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.privacy.dp.verify import verify_ledger

RUN_ID = "5b1d7e0c9a2f4e81"
Z, DELTA, BUDGET = 1.2, 1e-6, 10.0


def _ftrl_ledger(path: Path, factorization, schema, releases: int):
    signer = load_or_create_signer()
    ledger = Ledger(path, run_id=RUN_ID, signer=signer)
    for t in range(1, releases + 1):
        ledger.record(
            ftrl_entry_fields(
                round_number=t,
                factorization=factorization,
                schema=schema,
                noise_multiplier=Z,
                clip_norm=0.5,
                neighbouring="zero_out",
                delta=DELTA,
                budget_epsilon=BUDGET,
                population_size=1000,
                epsilon=epsilon_after(factorization, schema, Z, t, DELTA),
            )
            | {"training_round": t}
        )
    ledger.close("final", {"training_round": releases, "epsilon": ledger.releases[-1]["epsilon"]})
    return signer


def _rewrite(path: Path, signer, edit) -> None:
    """Edit the releases, re-hash and re-sign the chain with the run's own key."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    previous = "0" * 64
    for entry in entries:
        if entry.get("kind") == "release":
            edit(entry)
        entry["prev_hash"] = previous
        entry["hash"] = entry_hash(entry)
        entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
        previous = entry["hash"]
    path.write_text("".join(canonical_json(entry) + "\n" for entry in entries))


@pytest.mark.parametrize(
    ("factorization", "schema"),
    [
        (TreeFactorization(8), ParticipationSchema()),
        (
            banded_factorization(8, ParticipationSchema(2, 4), iterations=5),
            ParticipationSchema(2, 4),
        ),
    ],
    ids=["tree-single", "banded-b2-k4"],
)
def test_a_recorded_sensitivity_edited_and_resigned_fails_on_recomputation(
    tmp_path: Path, factorization, schema
) -> None:
    path = tmp_path / "ledger.jsonl"
    signer = _ftrl_ledger(path, factorization, schema, 6)
    assert verify_ledger(path).status == "final"
    # Re-signing alone, with the run's own key, still verifies: the signature is not
    # what the next check relies on.
    _rewrite(path, signer, lambda entry: None)
    assert verify_ledger(path).status == "final"
    _rewrite(path, signer, lambda entry: entry["ftrl"].update(sensitivity=1.0))
    result = verify_ledger(path)
    assert not result.ok and result.line == 1
    assert "recorded ftrl.sensitivity 1.0 differs from the sensitivity recomputed" in result.message


def test_an_understated_epsilon_fails_and_t_cannot_be_extended(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    f = TreeFactorization(8)
    signer = _ftrl_ledger(path, f, ParticipationSchema(), 6)
    _rewrite(path, signer, lambda entry: entry.update(epsilon=entry["epsilon"] / 2))
    result = verify_ledger(path)
    assert not result.ok and "differs from the recomputed" in result.message
    # The same releases recorded against a T of 4: release 5 is past the plan.
    path2 = tmp_path / "short.jsonl"
    signer = _ftrl_ledger(path2, f, ParticipationSchema(), 6)
    short = TreeFactorization(4)

    def plan_of_four(entry: dict) -> None:
        entry["ftrl"].update(factorization=short.to_dict(), planned_rounds=4, sensitivity=3**0.5)
        t = min(entry["round"], 4)
        entry["epsilon"] = epsilon_after(short, ParticipationSchema(), Z, t, DELTA)

    _rewrite(path2, signer, plan_of_four)
    result = verify_ledger(path2)
    assert not result.ok and result.line == 5, result.message
    assert "extending T is refused" in result.message
