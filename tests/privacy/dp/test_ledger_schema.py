"""Ledger schemas 2 and 3 (3 opens with a signed opening record): the public ledger
states the coordinator's data-independent bound and never the realised per-client
maximum; the verifier reads schema 1 ledgers, names the schema it refuses, and
recomputes every stated bound from the ledger alone."""

from __future__ import annotations

from typing import Any

from fedveil.privacy.dp import Ledger, canonical_json, entry_hash, verify_ledger
from fedveil.privacy.dp.ledger import LEDGER_SCHEMA, LEGACY_SCHEMA, SCHEMA_2, signed_message
from fedveil.privacy.dp.signing import load_or_create_signer


def resign(entries: list[dict[str, Any]]) -> bytes:
    """Re-hash and re-sign edited entries with the run's own key (the operator can)."""
    signer = load_or_create_signer()
    previous = "0" * 64
    for entry in entries:
        entry["prev_hash"] = previous
        entry["hash"] = entry_hash(entry)
        entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
        previous = entry["hash"]
    return "".join(canonical_json(entry) + "\n" for entry in entries).encode()


def test_new_entries_name_schema_3_and_a_ledger_without_an_opening_schema_2(make_ledger):
    path, _, _ = make_ledger(rounds=2, opened=True)
    assert {entry["schema"] for entry in Ledger(path).entries} == {LEDGER_SCHEMA}
    result = verify_ledger(path)
    assert result.ok and result.schema == LEDGER_SCHEMA
    # Not opened (a stage without a signer at the start, or an old run resumed): schema 2.
    path, _, _ = make_ledger(rounds=2, name="old.jsonl")
    assert {entry["schema"] for entry in Ledger(path).entries} == {SCHEMA_2}
    result = verify_ledger(path)
    assert result.ok and result.schema == SCHEMA_2 and "no opening record" in result.message


def test_a_schema_1_ledger_still_verifies_and_says_what_it_cannot_check(make_ledger):
    path, _, _ = make_ledger(rounds=3)
    entries = Ledger(path).entries
    for entry in entries:
        del entry["schema"]
    entries[-1]["epsilon_coordinator_max"] = 1.5  # schema 1 recorded the realised figure
    result = verify_ledger(resign(entries))
    assert result.ok and result.schema == LEGACY_SCHEMA
    assert f"ledger schema {LEGACY_SCHEMA}" in result.message
    assert "epsilon_coordinator_max" in result.message


def test_an_unknown_schema_is_refused_by_name(make_ledger):
    path, _, _ = make_ledger(rounds=2)
    entries = Ledger(path).entries
    entries[0]["schema"] = "fedveil.dp.ledger/9"
    result = verify_ledger(resign(entries))
    assert not result.ok and result.line == 1
    assert "'fedveil.dp.ledger/9'" in result.message and LEDGER_SCHEMA in result.message


def test_a_schema_2_entry_may_not_carry_the_realised_maximum(make_ledger):
    path, _, _ = make_ledger(rounds=3)
    entries = Ledger(path).entries
    entries[1]["epsilon_coordinator_max"] = 2.0
    result = verify_ledger(resign(entries))
    assert not result.ok and result.line == 2
    assert "private annex" in result.message


def test_schema_never_goes_back_to_1(make_ledger):
    path, _, _ = make_ledger(rounds=3)
    entries = Ledger(path).entries
    del entries[2]["schema"]
    result = verify_ledger(resign(entries))
    assert not result.ok and result.line == 3 and "never goes back" in result.message
