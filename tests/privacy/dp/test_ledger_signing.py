"""The signed, run-bound ledger against an operator who edits its own run files.

Each test plays the adversary with the tools a real one has: the ledger file, the
accountant, SHA-256 and (where stated) the operator's own signing key.
"""

import argparse
import json
import os
import stat

import pytest

from fedveil.cli.privacy import add_privacy
from fedveil.client.edge.witness import WitnessStore
from fedveil.privacy.dp import DpConfig, Ledger, PrivacyBudget, SkellamParams, compute_epsilon
from fedveil.privacy.dp.budget import event_from_entry
from fedveil.privacy.dp.ledger import (
    RELEASE,
    LedgerClosedError,
    LedgerRunMismatchError,
    canonical_json,
    entry_hash,
    entry_kind,
    signed_message,
)
from fedveil.privacy.dp.signing import (
    KeyStoreError,
    LedgerSigner,
    find_public_key,
    key_dir,
    load_or_create_signer,
    load_public_key,
)
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.server.engine.privacy_report import write_privacy_report

RUN_ID = "3f2a9c1e5b7d4a60"


def config(rounds=6, accountant="rdp", **overrides):
    values = dict(
        mechanism="central_gaussian",
        noise_multiplier=1.1,
        clip_norm=0.5,
        sampling_rate=0.05,
        rounds=rounds,
        delta=1e-5,
        budget_epsilon=10.0,
        cohort_size=20,
        accountant=accountant,
    )
    values.update(overrides)
    return DpConfig(**values)


def run_rounds(ledger, budget, cfg, first, last, witness=None):
    """Release training rounds first..last; a device witnesses each head it is sent."""
    for training_round in range(first, last + 1):
        if witness is not None and len(ledger):
            witness.record(canonical_json(ledger.witness_head()))
        budget.record_release(
            ledger,
            round_number=ledger.last_round + 1,
            event=cfg.round_event(),
            clip_norm=cfg.clip_norm,
            extra={"training_round": training_round},
        )
    if witness is not None:
        witness.record(canonical_json(ledger.witness_head()))


@pytest.fixture
def finished_run(tmp_path):
    """A finished 6-round run directory (ledger + report.json) and a device's witness file."""
    run_dir = tmp_path / "run"
    (run_dir / "privacy").mkdir(parents=True)
    cfg = config()
    ledger = Ledger(
        run_dir / "privacy" / "ledger.jsonl", run_id=RUN_ID, signer=load_or_create_signer()
    )
    budget = PrivacyBudget(cfg)
    witness = WitnessStore(tmp_path / "device" / "witness")
    run_rounds(ledger, budget, cfg, 1, 6, witness)
    ledger.close("final", {"training_round": 6, "epsilon": budget.spent()})
    witness.record(canonical_json(ledger.witness_head()))
    write_privacy_report(run_dir)
    return run_dir, cfg, witness.path_for(RUN_ID)


def ledger_file(run_dir):
    return run_dir / "privacy" / "ledger.jsonl"


def verify_cli(capsys, *argv):
    """`fedveil privacy verify ...` as the CLI parses and runs it: (exit code, output)."""
    parser = argparse.ArgumentParser(prog="fedveil")
    add_privacy(parser.add_subparsers())
    args = parser.parse_args(["privacy", "verify", *map(str, argv)])
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def read_entries(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_chain(path, entries, signer=None):
    """Re-hash the chain (and re-sign it when given a key), as a forger would."""
    previous = "0" * 64
    for entry in entries:
        entry["prev_hash"] = previous
        if signer is not None:
            entry["key_id"] = signer.key_id
        entry["hash"] = entry_hash(entry)
        if signer is not None:
            entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
        previous = entry["hash"]
    path.write_text("".join(canonical_json(entry) + "\n" for entry in entries))


def double_z_and_recompute(entries):
    """Claim twice the noise, with every epsilon recomputed by the real accountant."""
    events, epsilon = [], 0.0
    for entry in entries:
        if entry_kind(entry) != RELEASE:
            entry["epsilon"] = epsilon  # the final record restates the last release's
            continue
        entry["noise_multiplier"] *= 2
        events.append(event_from_entry(entry))
        entry["epsilon"] = epsilon = compute_epsilon(events, entry["delta"], entry["accountant"])
    return entries


# -- keys ----------------------------------------------------------------------------


def test_the_key_store_is_private_and_finds_keys_by_id(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDVEIL_KEY_DIR", str(tmp_path / "keys"))
    signer = load_or_create_signer()
    store = key_dir()
    assert store == tmp_path / "keys"
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    private = store / "ledger-signing.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert load_public_key(private.with_suffix(".pub")) == signer.public_key_bytes
    assert len(signer.key_id) == 32 and signer.key_id == load_or_create_signer().key_id
    assert find_public_key(signer.key_id) == signer.public_key_bytes
    assert find_public_key(LedgerSigner.generate().key_id) is None
    os.chmod(private, 0o644)
    with pytest.raises(KeyStoreError, match="mode 644"):
        load_or_create_signer()


def test_two_signers_never_share_a_key():
    assert LedgerSigner.generate().public_key_bytes != LedgerSigner.generate().public_key_bytes


# -- the three states ----------------------------------------------------------------


def test_a_finished_run_verifies_as_final(finished_run, capsys):
    run_dir, _, witness_file = finished_run
    code, out = verify_cli(capsys, run_dir)
    assert code == 0 and out.startswith("OK: final"), out
    code, out = verify_cli(capsys, run_dir, "--witness", witness_file)
    assert code == 0 and "7 witnessed heads" in out, out


def test_deleting_the_final_line_and_report_fails(finished_run, capsys):
    run_dir, _, _ = finished_run
    path = ledger_file(run_dir)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    (run_dir / "privacy" / "report.json").unlink()
    code, out = verify_cli(capsys, run_dir)
    assert code == 1 and "truncated" in out, out
    path.write_text("".join(lines[:-2]))  # and a release with it
    assert verify_cli(capsys, run_dir)[0] == 1


def test_an_interrupted_run_exits_3_and_names_the_round(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "privacy").mkdir(parents=True)
    cfg = config()
    ledger = Ledger(ledger_file(run_dir), run_id=RUN_ID, signer=load_or_create_signer())
    budget = PrivacyBudget(cfg)
    run_rounds(ledger, budget, cfg, 1, 3)
    ledger.close("interrupted", {"training_round": 4, "reason": "operator stop"})
    code, out = verify_cli(capsys, run_dir)
    assert code == 3 and "interrupted at training round 4" in out and "resumable" in out, out
    result = verify_ledger(ledger_file(run_dir))
    assert not result.ok and result.resumable and result.training_round == 4


def test_a_resumed_then_finished_run_passes_and_cutting_it_back_never_does(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "privacy").mkdir(parents=True)
    cfg, signer = config(), load_or_create_signer()
    ledger = Ledger(ledger_file(run_dir), run_id=RUN_ID, signer=signer)
    budget = PrivacyBudget(cfg)
    run_rounds(ledger, budget, cfg, 1, 3)
    ledger.close("interrupted", {"training_round": 3, "reason": "crash"})
    interrupted = ledger_file(run_dir).read_text()

    resumed = Ledger(ledger_file(run_dir), run_id=RUN_ID, signer=signer)
    budget = PrivacyBudget.from_ledger(cfg, resumed)  # releases only
    assert len(budget.history) == 3 and resumed.last_round == 3
    run_rounds(resumed, budget, cfg, 4, 6)
    assert [e["round"] for e in resumed.releases] == [1, 2, 3, 4, 5, 6]
    resumed.close("final", {"training_round": 6, "epsilon": budget.spent()})
    with pytest.raises(LedgerClosedError):
        resumed.close("final", {"training_round": 6, "epsilon": budget.spent()})
    assert verify_cli(capsys, run_dir)[0] == 0

    ledger_file(run_dir).write_text(interrupted)  # the finished run cut back
    code, out = verify_cli(capsys, run_dir)
    assert code == 3 and "interrupted at training round 3" in out, out


def test_one_ledger_per_run_and_per_key(finished_run, capsys):
    run_dir, _, _ = finished_run
    path = ledger_file(run_dir)
    with pytest.raises(LedgerRunMismatchError, match="run_id"):
        Ledger(path, run_id="another-run")
    with pytest.raises(LedgerRunMismatchError, match="key_id"):
        Ledger(path, run_id=RUN_ID, signer=LedgerSigner.generate())
    # An entry moved in from another run, re-hashed and re-signed with the run's key.
    entries = read_entries(path)
    entries[3]["run_id"] = "another-run"
    write_chain(path, entries, load_or_create_signer())
    code, out = verify_cli(capsys, run_dir)
    assert code == 1 and "run_id" in out, out


# -- forging -------------------------------------------------------------------------


def test_doubling_z_with_recomputed_epsilons_and_a_rehashed_chain_fails(finished_run, capsys):
    run_dir, _, _ = finished_run
    path = ledger_file(run_dir)
    entries = double_z_and_recompute(read_entries(path))
    write_chain(path, entries)  # the old signatures no longer match the new hashes
    (run_dir / "privacy" / "report.json").unlink()
    code, out = verify_cli(capsys, run_dir)
    assert code == 1 and "bad signature" in out, out
    for entry in entries:
        entry.pop("signature"), entry.pop("key_id")
    write_chain(path, entries)  # or strip the signatures altogether
    code, out = verify_cli(capsys, run_dir)
    assert code == 1 and "unsigned" in out, out


def test_resigning_with_a_fresh_key_fails_unless_given_and_then_fails_on_a_witness(
    finished_run, capsys, tmp_path
):
    run_dir, _, witness_file = finished_run
    path = ledger_file(run_dir)
    forger = LedgerSigner.generate()
    write_chain(path, double_z_and_recompute(read_entries(path)), forger)
    # The report too: its page without it would fail verify on its own.
    (run_dir / "privacy" / "report.json").unlink()
    (run_dir / "privacy" / "report.html").unlink()
    code, out = verify_cli(capsys, run_dir)
    assert code == 1 and "no public key" in out, out
    honest = tmp_path / "honest.pub"
    honest.write_bytes(load_or_create_signer().public_key_bytes)
    code, out = verify_cli(capsys, run_dir, "--public-key", honest)
    assert code == 1 and "given public key" in out, out
    forged = tmp_path / "forged.pub"
    forged.write_bytes(forger.public_pem())
    code, out = verify_cli(capsys, run_dir, "--public-key", forged)
    assert code == 0, out  # a key the verifier accepts, and nothing else to compare with
    code, out = verify_cli(capsys, run_dir, "--public-key", forged, "--witness", witness_file)
    assert code == 1 and "re-signed" in out, out


def test_resigning_with_the_operators_own_key_fails_on_a_witness(finished_run, capsys):
    run_dir, _, witness_file = finished_run
    path = ledger_file(run_dir)
    write_chain(path, double_z_and_recompute(read_entries(path)), load_or_create_signer())
    # The report too: its page without it would fail verify on its own.
    (run_dir / "privacy" / "report.json").unlink()
    (run_dir / "privacy" / "report.html").unlink()
    assert verify_cli(capsys, run_dir)[0] == 0  # the key alone cannot stop its owner
    code, out = verify_cli(capsys, run_dir, "--witness", witness_file)
    assert code == 1 and "rewritten or re-signed" in out, out


def test_rolling_back_to_a_signed_prefix_fails_on_a_witness(finished_run, capsys):
    run_dir, cfg, witness_file = finished_run
    path = ledger_file(run_dir)
    prefix = path.read_text().splitlines(keepends=True)[:3]
    path.write_text("".join(prefix))
    ledger = Ledger(path, run_id=RUN_ID, signer=load_or_create_signer())
    budget = PrivacyBudget.from_ledger(cfg, ledger)
    ledger.close("final", {"training_round": 3, "epsilon": budget.spent()})  # validly signed
    # The report too: its page without it would fail verify on its own.
    (run_dir / "privacy" / "report.json").unlink()
    (run_dir / "privacy" / "report.html").unlink()
    assert verify_cli(capsys, run_dir)[0] == 0
    code, out = verify_cli(capsys, run_dir, "--witness", witness_file)
    assert code == 1 and "rolled back" in out, out


def test_report_json_anchors_its_head(finished_run, capsys):
    run_dir, _, _ = finished_run
    path = ledger_file(run_dir)
    prefix = path.read_text().splitlines(keepends=True)[:3]
    path.write_text("".join(prefix))
    ledger = Ledger(path, run_id=RUN_ID, signer=load_or_create_signer())
    ledger.close("final", {"training_round": 3, "epsilon": ledger.releases[-1]["epsilon"]})
    code, out = verify_cli(capsys, run_dir)  # report.json still names the old head
    assert code == 1 and "anchored head" in out, out


# -- Skellam and second accountants ----------------------------------------------------


def skellam_ledger(tmp_path, shares=(8, 10, 9), name="skellam.jsonl"):
    cfg = config(
        rounds=len(shares),
        mechanism="distributed_skellam",
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=0.02,
        cohort_size=12,
        accountant="auto",
    )
    params = SkellamParams.calibrate(
        dim=200, clip_norm=1.0, noise_multiplier=1.0, num_clients=12, min_clients=8, bits=20
    )
    path = tmp_path / name
    ledger = Ledger(path, run_id=RUN_ID, signer=load_or_create_signer())
    budget = PrivacyBudget(cfg)
    for number, survivors in enumerate(shares, start=1):
        z = params.noise_multiplier_for(survivors, cfg.neighbouring)
        budget.record_release(
            ledger,
            round_number=number,
            event=cfg.round_event(z),
            clip_norm=cfg.clip_norm,
            extra={"skellam": params.to_dict(), "noise_shares": survivors},
        )
    ledger.close("final", {"training_round": len(shares), "epsilon": budget.spent()})
    return path


def test_skellam_z_is_rechecked_from_the_discrete_parameters(tmp_path):
    path = skellam_ledger(tmp_path)
    assert verify_ledger(path).ok
    entries = read_entries(path)
    entries[1]["noise_shares"] = 12  # claim more noise shares than were summed
    write_chain(path, entries, load_or_create_signer())
    result = verify_ledger(path)
    assert not result.ok and result.line == 2 and "Skellam" in result.message
    entries = read_entries(path)
    entries[1]["noise_shares"] = 10
    entries[1]["skellam"]["local_variance"] *= 1.5  # or more noise per share
    write_chain(path, entries, load_or_create_signer())
    result = verify_ledger(path)
    assert not result.ok and result.line == 2 and "changed" in result.message
    entries = read_entries(path)
    for entry in entries:
        entry["accountant"] = "pld"  # a Gaussian-only PLD: no analysis makes it sound here
    write_chain(path, entries, load_or_create_signer())
    result = verify_ledger(path)
    assert not result.ok and result.line == 1 and "not sound" in result.message
    path = skellam_ledger(tmp_path, name="fresh.jsonl")
    entries = read_entries(path)
    for entry in entries:
        entry.pop("skellam", None), entry.pop("noise_shares", None)
    write_chain(path, entries, load_or_create_signer())
    result = verify_ledger(path)
    assert not result.ok and "must record 'skellam'" in result.message


def test_second_accountant_rule_is_the_tightest_sound_bound(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "privacy").mkdir(parents=True)
    cfg = config(rounds=3, accountant="prv")
    ledger = Ledger(ledger_file(run_dir), run_id=RUN_ID, signer=load_or_create_signer())
    budget = PrivacyBudget(cfg)
    run_rounds(ledger, budget, cfg, 1, 3)
    ledger.close("final", {"training_round": 3, "epsilon": budget.spent()})
    # PRV is tighter than RDP: below RDP's bound by more than 0.1%, so naming RDP flags it ...
    code, out = verify_cli(capsys, run_dir, "--second-accountant", "rdp")
    assert code == 1 and "is below" in out and "0.1%" in out, out
    # ... but not below the tightest of the sound accountants named.
    code, out = verify_cli(
        capsys, run_dir, "--second-accountant", "rdp", "--second-accountant", "pld"
    )
    assert code == 0, out
    # An understated figure re-signed by the operator fails against them.
    path = ledger_file(run_dir)
    entries = read_entries(path)
    events = [event_from_entry(e) for e in entries if entry_kind(e) == RELEASE]
    floor = min(compute_epsilon(events, cfg.delta, name) for name in ("pld", "prv", "rdp"))
    assert entries[2]["epsilon"] >= 0.999 * floor
    result = verify_ledger(path, accountant=("pld", "rdp"), rel_tol=0.05)
    assert result.ok, result.message
    entries[2]["epsilon"] = entries[3]["epsilon"] = 0.99 * floor
    write_chain(path, entries, load_or_create_signer())
    result = verify_ledger(path, accountant=("pld", "rdp"), rel_tol=0.05)  # primary is lax
    assert not result.ok and "tightest" in result.message, result.message
