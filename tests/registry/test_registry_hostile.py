"""The registry against a hostile caller and a careless umask: look-alike names with a
trailing newline are refused, and a private model's files are as private as the run's."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fedveil.client.edge.witness import parse_head
from fedveil.server.coordinator.rundir import RunDir
from fedveil.server.registry import Registry, RegistryError


@pytest.mark.parametrize("name", ["fashion\n", "fashion\n\n", "\nfashion"])
def test_a_name_ending_in_a_newline_is_refused(tmp_path: Path, plain_run: Path, name: str) -> None:
    with pytest.raises(RegistryError, match="model name"):
        Registry(tmp_path / "reg").register(plain_run, name=name)
    assert not (tmp_path / "reg").exists() or not any((tmp_path / "reg").rglob("fashion*"))


def test_run_ids_and_witness_fields_ending_in_a_newline_are_refused(tmp_path: Path) -> None:
    assert RunDir(tmp_path, "run-0001").run_id == "run-0001"
    with pytest.raises(ValueError, match="not a fedveil run id"):
        RunDir(tmp_path, "run-0001\n")
    head = {
        "run_id": "run-0001\n",
        "seq": 1,
        "hash": "a" * 64,
        "key_id": "b" * 32,
        "signature": "c" * 128,
    }
    with pytest.raises(ValueError, match="run_id='run-0001\\\\n' is invalid"):
        parse_head(json.dumps(head))
    head["run_id"], head["hash"] = "run-0001", "a" * 63 + "\n"
    with pytest.raises(ValueError, match="hash="):
        parse_head(json.dumps(head))


def test_a_registered_model_is_as_private_as_the_run(tmp_path: Path, plain_run: Path) -> None:
    """Under the common umask 022 (a shell's `fedveil models register`) the copy and the
    card were 644 and their directories 755; now 600 and 700, as the run's model is."""
    old = os.umask(0o022)
    try:
        model = Registry(tmp_path / "reg").register(plain_run, name="fashion")
    finally:
        os.umask(old)
    assert stat.S_IMODE((plain_run / "model.safetensors").stat().st_mode) == 0o600
    version = tmp_path / "reg" / "fashion" / "v1"
    files = [version / "model.safetensors", version / "card.json"]
    files += [tmp_path / "reg" / "index.json", tmp_path / "reg" / ".lock"]
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (tmp_path / "reg", version.parent, version):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert model is not None
