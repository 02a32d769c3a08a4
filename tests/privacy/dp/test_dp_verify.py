import io
import json

import pytest

from fedveil.privacy.dp import Ledger, canonical_json, entry_hash, verify_ledger
from fedveil.privacy.dp.ledger import signed_message
from fedveil.privacy.dp.signing import load_or_create_signer


def test_clean_ledger_verifies_from_path_bytes_stream_and_entries(make_ledger):
    path, _, budget = make_ledger(rounds=6)
    for source in (
        path,
        str(path),
        path.read_bytes(),
        io.BytesIO(path.read_bytes()),
        Ledger(path).entries,
    ):
        result = verify_ledger(source)
        assert result.ok, result.message
        assert result.status == "final" and result.exit_code == 0
        assert result.entries == 7 and result.releases == 6 and result.epsilon_recomputed == 6
        assert result.final_epsilon == pytest.approx(budget.spent())
    assert verify_ledger(path, expected_entries=7, expected_head_hash=Ledger(path).head_hash)


def test_a_tampered_byte_fails_at_its_line(make_ledger):
    path, _, _ = make_ledger(rounds=6)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"clip_norm":0.53', b'"clip_norm":0.63', 1)
    path.write_bytes(b"\n".join(lines))
    result = verify_ledger(path)
    assert not result.ok and result.line == 3
    assert "hash" in result.message


@pytest.mark.parametrize("offset", [0, 57, 150, 301])
def test_flipping_any_byte_fails(make_ledger, offset):
    path, _, _ = make_ledger(rounds=3)
    data = bytearray(path.read_bytes())
    data[offset] = ord("#") if data[offset] != ord("#") else ord("$")
    path.write_bytes(bytes(data))
    assert not verify_ledger(path).ok


def test_truncation_fails(make_ledger):
    path, _, _ = make_ledger(rounds=5, close=None)
    full = path.read_bytes()
    head, count = Ledger(path).head_hash, len(Ledger(path))
    path.write_bytes(full[:-40])  # mid-line
    result = verify_ledger(path)
    assert not result.ok and result.line == 5 and "partial last line" in result.message
    cut = full[: full.rstrip(b"\n").rfind(b"\n") + 1]  # at a line boundary
    path.write_bytes(cut)
    result = verify_ledger(path)  # no final or interruption record: truncated
    assert not result.ok and result.exit_code == 1 and "truncated" in result.message
    assert "training_round" not in result.message
    assert not verify_ledger(path, expected_head_hash=head).ok
    result = verify_ledger(path, expected_entries=count)
    assert not result.ok and "truncated" in result.message


def test_reordered_lines_fail_at_the_first_moved_line(make_ledger):
    path, _, _ = make_ledger(rounds=5)
    lines = path.read_bytes().split(b"\n")
    lines[1], lines[3] = lines[3], lines[1]
    path.write_bytes(b"\n".join(lines))
    result = verify_ledger(path)
    assert not result.ok and result.line == 2 and "prev_hash" in result.message


def rewrite_chain(entries):
    """Re-hash and re-sign edited entries with the run's own key, as a buggy writer would."""
    signer = load_or_create_signer()
    previous = "0" * 64
    for entry in entries:
        entry["prev_hash"] = previous
        entry["hash"] = entry_hash(entry)
        entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
        previous = entry["hash"]
    return "".join(canonical_json(entry) + "\n" for entry in entries).encode()


def test_understated_epsilon_fails_even_with_a_consistent_chain(make_ledger):
    path, _, _ = make_ledger(rounds=5)
    entries = Ledger(path).entries
    entries[3]["epsilon"] *= 0.98
    entries[4]["epsilon"] = max(entries[4]["epsilon"], entries[3]["epsilon"])
    result = verify_ledger(rewrite_chain(entries))
    assert not result.ok and result.line == 4 and "recomputed" in result.message


def test_budget_and_round_violations_fail(make_ledger):
    path, _, _ = make_ledger(rounds=4)
    entries = Ledger(path).entries
    entries[2]["budget_epsilon"] = entries[2]["epsilon"] / 2
    result = verify_ledger(rewrite_chain([dict(e) for e in entries]))
    assert not result.ok and result.line == 3
    entries = Ledger(path).entries
    entries[1]["round"] = 5
    result = verify_ledger(rewrite_chain(entries))
    assert not result.ok and result.line == 2 and "contiguous" in result.message


def test_recomputation_with_a_tighter_accountant_accepts_upper_bounds(make_ledger):
    path, _, _ = make_ledger(rounds=3, accountant="rdp")
    assert verify_ledger(path, accountant="prv").ok  # RDP >= PRV: still an upper bound
    pld_path, _, _ = make_ledger(rounds=3, accountant="prv", name="prv.jsonl")
    entries = Ledger(pld_path).entries
    assert json.loads(json.dumps(entries)) == entries
    result = verify_ledger(pld_path, accountant="rdp")
    assert not result.ok and "is below" in result.message  # PRV < RDP bound: flagged


def test_the_first_discrepancy_wins_over_later_garbage(make_ledger):
    path, _, _ = make_ledger(rounds=5)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"clip_norm":0.53', b'"clip_norm":0.54')  # line 3
    lines[4] = b"\xff garbage"  # line 5
    path.write_bytes(b"\n".join(lines))
    result = verify_ledger(path)
    assert not result.ok and result.line == 3 and result.entries == 2
