import itertools
import json

import pytest

from fedveil.privacy.dp import GENESIS_HASH, Ledger, LedgerCorruptError, entry_hash


def test_entries_form_a_hash_chain_from_genesis(make_ledger):
    path, _, _ = make_ledger(rounds=4)
    entries = Ledger(path).entries
    assert entries[0]["prev_hash"] == GENESIS_HASH
    for previous, entry in itertools.pairwise(entries):
        assert entry["prev_hash"] == previous["hash"]
    assert all(entry["hash"] == entry_hash(entry) for entry in entries)
    assert [entry["round"] for entry in Ledger(path).releases] == [1, 2, 3, 4]
    assert [entry["seq"] for entry in entries] == [1, 2, 3, 4, 5]
    assert [entry["kind"] for entry in entries] == ["release"] * 4 + ["final"]
    assert {entry["run_id"] for entry in entries} == {"run-1"}
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6  # one terminated line per entry
    required = {
        "round",
        "mechanism",
        "noise_multiplier",
        "clip_norm",
        "sampling_rate",
        "sampling",
        "neighbouring",
        "privacy_unit",
        "delta",
        "epsilon",
        "accountant",
        "budget_epsilon",
        "timestamp",
        "prev_hash",
        "hash",
        "run_id",
        "kind",
        "seq",
        "key_id",
        "signature",
    }
    first = json.loads(lines[0])
    assert required <= set(first)
    # Per-round counts reveal who took part: they are not public ledger fields.
    assert "cohort_planned" not in first and "cohort_aggregated" not in first


def test_record_is_durable_before_returning(make_ledger, monkeypatch):
    import os

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path, _, _ = make_ledger(rounds=2, name="durable.jsonl", close=None)
    assert len(synced) >= 3  # each append, plus the directory when the file was created
    assert len(Ledger(path)) == 2


def test_rounds_must_be_contiguous(make_ledger):
    path, _, _ = make_ledger(rounds=2, close=None)
    ledger = Ledger(path)
    fields = {k: v for k, v in ledger.entries[-1].items() if k not in ("hash", "prev_hash")}
    with pytest.raises(ValueError, match="expected 3"):
        ledger.record({**fields, "round": 4})
    with pytest.raises(ValueError, match="lacks fields"):
        ledger.record({"round": 3})


def test_partial_last_line_is_reported_not_accepted(make_ledger):
    path, _, _ = make_ledger(rounds=3, close=None)
    with path.open("ab") as handle:
        handle.write(b'{"round": 4, "mechan')  # crash in the middle of an append
    with pytest.raises(LedgerCorruptError, match="partial last line") as error:
        Ledger(path)
    assert error.value.line == 4
    assert Ledger.discard_partial_tail(path) == b'{"round": 4, "mechan'
    assert len(Ledger(path)) == 3


def test_opening_an_edited_ledger_fails(make_ledger):
    path, _, _ = make_ledger(rounds=3)
    path.write_bytes(path.read_bytes().replace(b'"round":2', b'"round":7'))
    with pytest.raises(LedgerCorruptError, match="line 2"):
        Ledger(path)


def test_a_second_writer_is_detected(make_ledger):
    path, _, _ = make_ledger(rounds=2, close=None)
    first, second = Ledger(path), Ledger(path)
    fields = {k: v for k, v in first.entries[-1].items() if k not in ("hash", "prev_hash")}
    first.record({**fields, "round": 3})
    with pytest.raises(LedgerCorruptError, match="another writer"):
        second.record({**fields, "round": 3})
    assert len(Ledger(path)) == 3
