"""Ledger schema 3: the signed opening record, as `fedveil privacy verify` checks it."""

from __future__ import annotations

import pytest

from fedveil.privacy.dp import Ledger, canonical_json, entry_hash, verify_ledger
from fedveil.privacy.dp.ledger import LedgerCorruptError, signed_message
from fedveil.privacy.dp.signing import LedgerSigner, load_or_create_signer


def resign(entries, signer=None) -> bytes:
    """Re-chain, re-hash and re-sign edited entries (the operator holds the key)."""
    signer = signer or load_or_create_signer()
    previous = "0" * 64
    for number, entry in enumerate(entries, start=1):
        entry["seq"], entry["prev_hash"] = number, previous
        entry["key_id"] = signer.key_id
        entry["hash"] = entry_hash(entry)
        entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
        previous = entry["hash"]
    return "".join(canonical_json(entry) + "\n" for entry in entries).encode()


def test_an_opened_ledger_names_its_opening_in_every_entry(make_ledger):
    path, _, _ = make_ledger(rounds=3, opened=True)
    entries = Ledger(path).entries
    opening = entries[0]
    assert opening["kind"] == "open" and opening["releases"] == 0
    assert bytes.fromhex(opening["public_key"]) == load_or_create_signer().public_key_bytes
    assert [e["opening"] for e in entries[1:]] == [opening["hash"]] * 4
    assert verify_ledger(path).ok


def test_a_ledger_opens_once_and_only_when_signed(tmp_path):
    with pytest.raises(ValueError, match="must be signed"):
        Ledger(tmp_path / "unsigned.jsonl").open({"plan": {}})
    ledger = Ledger(tmp_path / "l.jsonl", run_id="r", signer=load_or_create_signer())
    first = ledger.open({"plan": {"mechanism": "central"}, "cohort_commitment": "ab" * 32})
    assert ledger.open({"plan": {"mechanism": "other"}}) == first  # a resume keeps it
    assert Ledger(ledger.path).opening == first


def test_removing_or_rekeying_the_opening_is_found(make_ledger):
    path, _, _ = make_ledger(rounds=2, opened=True)
    entries = Ledger(path).entries
    stripped = verify_ledger(resign(entries[1:]))
    assert not stripped.ok and stripped.line == 1 and "opening record" in stripped.message
    other = LedgerSigner.generate()
    swapped = [dict(e) for e in entries]
    swapped[0]["public_key"] = other.public_key_bytes.hex()
    rekeyed = verify_ledger(resign(swapped))
    assert not rekeyed.ok and rekeyed.line == 1 and "public_key" in rekeyed.message


def test_an_entry_of_another_chain_is_found(make_ledger):
    path, _, _ = make_ledger(rounds=2, opened=True)
    entries = Ledger(path).entries
    entries[2]["opening"] = "f" * 64
    result = verify_ledger(resign(entries))
    assert not result.ok and result.line == 3 and "another chain" in result.message


def test_an_opening_anywhere_but_first_is_corrupt(make_ledger, tmp_path):
    path, _, _ = make_ledger(rounds=2, opened=True)
    entries = Ledger(path).entries
    moved = [entries[1], entries[0], *entries[2:]]
    bad = tmp_path / "moved.jsonl"
    bad.write_bytes(resign([dict(e) for e in moved]))
    with pytest.raises(LedgerCorruptError):
        Ledger(bad)
    assert not verify_ledger(bad).ok
