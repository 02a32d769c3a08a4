"""`fedveil silo`: four silo processes with one config train together (issue 34)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedveil.privacy.secagg.identity_files import read_public_key, write_identity_key
from fedveil.privacy.secagg.identity_keys import Roster

pytestmark = pytest.mark.procs
WORLD = 4
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_four_fedveil_silo_processes_end_with_the_same_model(tmp_path):
    keys = [write_identity_key(tmp_path / "keys", f"silo-{r}") for r in range(WORLD)]
    roster = tmp_path / "roster.json"
    roster.write_text(
        Roster({r: read_public_key(str(pub)) for r, (_, pub) in enumerate(keys)}).to_json()
    )
    config = tmp_path / "run.toml"
    config.write_text(
        '[model]\ntask = "tests.tiny_task:make"\n[data]\nnum_clients = 4\n'
        "[server]\nrounds = 2\nper_round = 4\n"
    )
    address = f"tcp://127.0.0.1:{_free_port()}"
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
    assert len({o["run_id"] for o in outputs}) == 1
    assert len({o["model_sha256"] for o in outputs}) == 1  # one model, no coordinator
    assert all(o["test_accuracy"] > 0.6 for o in outputs)
    for r in range(WORLD):
        rounds = (tmp_path / f"silo-{r}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["members"] for x in rounds] == [[0, 1, 2, 3]] * 2
