"""`fedveil silo`: four silo processes with one config train together (issue 34)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loopback_ports import free_port

from fedveil.privacy.secagg.identity_files import read_public_key, write_identity_key
from fedveil.privacy.secagg.identity_keys import Roster

pytestmark = pytest.mark.procs
WORLD = 4
REPO = Path(__file__).resolve().parents[2]


def _run_silos(tmp_path: Path, config_text: str) -> tuple[list[dict], Path]:
    """WORLD `fedveil silo` processes with one config; their JSON summaries, and the
    roster of their identity keys."""
    keys = [write_identity_key(tmp_path / "keys", f"silo-{r}") for r in range(WORLD)]
    roster = tmp_path / "roster.json"
    roster.write_text(
        Roster({r: read_public_key(str(pub)) for r, (_, pub) in enumerate(keys)}).to_json()
    )
    config = tmp_path / "run.toml"
    config.write_text(config_text)
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fedveil.cli",
                "silo",
                "--config",
                str(config),
                "--rank",
                str(r),
                "--world",
                str(WORLD),
                "--rendezvous",
                address,
                "--identity-key",
                str(keys[r][0]),
                "--roster",
                str(roster),
                "--out",
                str(tmp_path / f"silo-{r}"),
                "--timeout",
                "30",
                "--json",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(WORLD)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outputs, roster


TINY = (
    '[model]\ntask = "tests.tiny_task:make"\n[data]\nnum_clients = 4\n'
    "[server]\nrounds = 2\nper_round = 4\n"
)


def test_four_fedveil_silo_processes_end_with_the_same_model(tmp_path):
    outputs, _ = _run_silos(tmp_path, TINY)
    assert len({o["run_id"] for o in outputs}) == 1
    assert len({o["model_sha256"] for o in outputs}) == 1  # one model, no coordinator
    assert all(o["test_accuracy"] > 0.6 for o in outputs)
    for r in range(WORLD):
        rounds = (tmp_path / f"silo-{r}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["members"] for x in rounds] == [[0, 1, 2, 3]] * 2


def test_silo_processes_ledgers_verify_against_their_roster(tmp_path, capsys):
    """Under distributed DP each silo process signs and closes its own ledger; gathered
    into one run directory they verify against the roster the silos were started with."""
    from fedveil.cli import main

    dp = '[dp]\nmechanism = "distributed"\nepsilon = 8.0\n'
    dp += "[secagg]\ndropout_rate = 0.25\nadversarial_rate = 0.25\n"
    outputs, roster = _run_silos(tmp_path, TINY + dp)
    assert len({o["run_id"] for o in outputs}) == 1
    run_dir = tmp_path / "audit"
    for r in range(WORLD):
        (run_dir / "silos" / str(r)).mkdir(parents=True)
        ledger = (tmp_path / f"silo-{r}" / "ledger.jsonl").read_bytes()
        (run_dir / "silos" / str(r) / "ledger.jsonl").write_bytes(ledger)
    assert main(["privacy", "verify", str(run_dir), "--silo-keys", str(roster)]) == 0
    assert "4 silos' ledgers signed by their keys and in agreement: 2 rounds" in (
        capsys.readouterr().out
    )
