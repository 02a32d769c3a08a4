"""`fedveil privacy verify RUN_DIR` on a secure all-reduce run: every silo's signed ledger
against its pinned (or given) key, and the silos' agreement, attacked as whoever holds
the run directory would attack it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedveil.cli import main
from fedveil.privacy.dp.ledger import canonical_json, entry_hash, signed_message
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.privacy.secagg.identity_keys import Roster


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 4-silo run under distributed DP, 2 rounds (about a second)."""
    out = tmp_path_factory.mktemp("allreduce") / "run"
    argv = ["simulate", "--aggregation", "allreduce", "--task", "tests.tiny_task:make"]
    argv += ["--clients", "4", "--per-round", "4", "--rounds", "2", "--out", str(out)]
    argv += ["--dp", "distributed", "--epsilon", "8", "--quiet"]
    argv += ["--set", "secagg.dropout_rate=0.25", "--set", "secagg.adversarial_rate=0.25"]
    assert main(argv) == 0
    return out


@pytest.fixture
def copy(run: Path, tmp_path: Path) -> Path:
    """A copy of the run directory the test may attack."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def _verify(run_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["privacy", "verify", str(run_dir), *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def _ledger(run_dir: Path, silo: int) -> Path:
    return run_dir / "silos" / str(silo) / "ledger.jsonl"


def _entries(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, entries: list[dict], signer: LedgerSigner | None = None) -> None:
    """Write `entries` back; with `signer`, re-chained and re-signed by it (a forger's key)."""
    if signer is not None:
        prev = "0" * 64
        for entry in entries:
            entry["prev_hash"], entry["key_id"] = prev, signer.key_id
            entry["hash"] = entry_hash(entry)
            entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
            prev = entry["hash"]
    path.write_text("".join(canonical_json(e) + "\n" for e in entries))


def _roster(run_dir: Path) -> dict[int, bytes]:
    return dict(Roster.from_json((run_dir / "silos" / "roster.json").read_text()))


def test_every_silos_ledger_verifies_against_its_pinned_key(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The silos' keys are pinned with the run; each ledger is closed by a final record."""
    code, text = _verify(run, capsys)
    assert code == 0, text
    assert "4 silos' ledgers signed by their keys and in agreement: 2 rounds" in text
    assert _entries(_ledger(run, 2))[-1]["kind"] == "final"
    code, text = _verify(run, capsys, "--silo-keys", str(run / "silos" / "roster.json"))
    assert code == 0, text


def test_an_altered_line_is_refused_naming_the_silo(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = _entries(_ledger(copy, 2))
    entries[0]["noise_multiplier"] *= 2  # claim twice the noise in round 1
    _write(_ledger(copy, 2), entries)
    code, text = _verify(copy, capsys)
    assert code == 1 and "silo 2: line 1" in text, text


def test_a_silo_re_signed_with_a_swapped_pinned_key_disagrees_with_the_others(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The holder of the directory rewrites silo 1's ledger (another sum than the one the
    silos saw), re-signs it with a key of their own and pins that key: the signatures
    and the ledger's own checks pass, the silos' cross-check does not, and the roster
    the silos enrolled with refuses the forged key."""
    true_roster = copy.parent / "enrolled-roster.json"
    shutil.copy(copy / "silos" / "roster.json", true_roster)
    forger = LedgerSigner(Ed25519PrivateKey.generate())
    entries = _entries(_ledger(copy, 1))
    for entry in entries:
        if entry["kind"] == "release":
            entry["sum_sha256"] = "0" * 64
    _write(_ledger(copy, 1), entries, forger)
    keys = _roster(copy)
    keys[1] = forger.public_key_bytes
    (copy / "silos" / "roster.json").write_text(Roster(keys).to_json())
    code, text = _verify(copy, capsys)
    assert code == 1, text
    assert "silo 1: round 1: sum_sha256 = '000" in text and "silo 0's is" in text, text
    code, text = _verify(copy, capsys, "--silo-keys", str(true_roster))
    assert code == 1 and "silo 1: line 1: signed by key_id" in text, text


def test_a_dropped_silo_ledger_is_refused(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(copy / "silos" / "3")
    code, text = _verify(copy, capsys)
    assert code == 1 and "silo 3: no ledger" in text, text


def test_an_extra_silo_ledger_is_refused(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(copy / "silos" / "0", copy / "silos" / "4")
    code, text = _verify(copy, capsys)
    assert code == 1 and "silo 4: a ledger, but no key" in text, text


def test_swapped_keys_are_refused(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = _roster(copy)
    keys[0], keys[1] = keys[1], keys[0]
    (copy / "silos" / "roster.json").write_text(Roster(keys).to_json())
    code, text = _verify(copy, capsys)
    assert code == 1 and "silo 0: line 1: signed by key_id" in text, text


def test_swapped_ledgers_with_their_keys_are_refused(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ledgers and keys of silos 0 and 1 swapped together: every signature holds, but each
    entry names the silo that wrote it."""
    silos = copy / "silos"
    (silos / "0").rename(silos / "tmp")
    (silos / "1").rename(silos / "0")
    (silos / "tmp").rename(silos / "1")
    keys = _roster(copy)
    keys[0], keys[1] = keys[1], keys[0]
    (silos / "roster.json").write_text(Roster(keys).to_json())
    code, text = _verify(copy, capsys)
    assert code == 1 and "silo 0: line 1: silo = 1" in text, text


def test_missing_pinned_keys_are_refused_unless_given(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roster = copy.parent / "roster.json"
    (copy / "silos" / "roster.json").rename(roster)
    code, text = _verify(copy, capsys)
    assert code == 1 and "no pinned silo keys" in text, text
    code, text = _verify(copy, capsys, "--silo-keys", str(roster))
    assert code == 0, text


def test_a_round_one_silo_did_not_sign_is_refused(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Silo 2's ledger cut after round 1 and re-closed with its own key (as if the holder
    had that key): the others list it in round 2's members, so the cut is found."""
    entries = _entries(_ledger(copy, 2))
    kept = [e for e in entries if e["kind"] == "release" and e["round"] == 1]
    final = dict(entries[-1])
    final.update(training_round=1, releases=1, epsilon=kept[0]["epsilon"], seq=2)
    signer = LedgerSigner(Ed25519PrivateKey.generate())
    _write(_ledger(copy, 2), [*kept, final], signer)
    keys = _roster(copy)
    keys[2] = signer.public_key_bytes
    (copy / "silos" / "roster.json").write_text(Roster(keys).to_json())
    code, text = _verify(copy, capsys)
    assert code == 1, text
    assert "silo 2: round 2: listed in members [0, 1, 2, 3], but no entry" in text, text


def test_privacy_report_of_an_allreduce_run_states_the_verified_epsilon_and_trust_model(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fedveil privacy report` writes the silos' agreed account, with the trust model."""
    code = main(["privacy", "report", str(copy)])
    text = capsys.readouterr().out
    assert code == 0, text
    report = json.loads((copy / "privacy" / "report.json").read_text())
    final = _entries(_ledger(copy, 0))[-1]
    assert report["aggregation"] == "allreduce" and report["verification"]["ok"] is True
    assert report["epsilon"] == final["epsilon"] and len(report["rounds"]) == 2
    assert report["silos"] == [0, 1, 2, 3]
    assert "colluding silos" in report["trust_model"]
    assert f"epsilon {final['epsilon']:.4f}" in text
    assert (copy / "privacy" / "report.html").exists()


def test_privacy_report_of_an_altered_silo_ledger_fails_with_no_figure(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whoever holds the run directory lowers one silo's epsilon: the report refuses
    every figure and exits non-zero instead of reporting the altered account."""
    entries = _entries(_ledger(copy, 1))
    entries[0]["epsilon"] = 0.01
    _write(_ledger(copy, 1), entries)
    code = main(["privacy", "report", str(copy)])
    text = capsys.readouterr().out
    assert code == 1, text
    report = json.loads((copy / "privacy" / "report.json").read_text())
    assert report["verification"]["ok"] is False and report["epsilon"] is None
    assert report["rounds"] == [] and "silo 1" in report["statement"]
