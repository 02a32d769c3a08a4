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


def _tamper(model_file: Path) -> None:
    """Change the weights and keep a valid safetensors file with the same metadata."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(model_file), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(model_file))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(model_file), metadata=meta)


def test_a_version_whose_model_file_changed_is_not_served(
    tmp_path: Path, plain_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The card binds the run's ledger (its guarantee) to the model's SHA-256; before, a
    model file replaced after registration was served, and promoted, under that card."""
    from fedveil.server.serving.versions import PromotedVersion, _registry_version

    reg = Registry(tmp_path / "reg")
    reg.register(plain_run, name="fashion")
    reg.promote("fashion", 1)
    tasks = ("tiny_task:make",)  # the run's custom task, named as the operator would
    served = PromotedVersion(tmp_path / "reg", "fashion", recheck_s=3600, allowed_tasks=tasks)
    assert served.pick() is not None and served.pick().version == "1"
    assert _registry_version("fashion@1", None, tmp_path / "reg", allowed_tasks=tasks)

    v2 = reg.register(plain_run, name="fashion")
    _tamper(v2.model_path)
    with pytest.raises(RegistryError, match=r"fashion@2: .* hashes to [0-9a-f]{64}, its card"):
        _registry_version("fashion@2", None, tmp_path / "reg", allowed_tasks=tasks)
    # Promoted, the changed version is not loaded: the coordinator's [serving] keeps v1.
    reg.promote("fashion", 2)
    served.refresh()
    assert served.pick().version == "1"
    assert "cannot load fashion@2" in caplog.text and "changed after registration" in caplog.text
    served.close()


def test_a_version_is_loaded_from_the_bytes_its_card_hash_checked(
    tmp_path: Path, plain_run: Path
) -> None:
    """The hash was checked on one read and the model loaded on another: a file swapped
    between the two was served under the card. Now the checked bytes are the ones loaded,
    and loading never opens the file again."""
    import torch

    from fedveil.server.serving.loading import load_model_file

    version = Registry(tmp_path / "reg").register(plain_run, name="fashion")
    checked = version.checked_model_bytes()
    honest, _ = load_model_file(version.model_path, allowed_tasks=("tiny_task:make",))
    _tamper(version.model_path)  # swapped after the check
    swapped, _ = load_model_file(version.model_path, allowed_tasks=("tiny_task:make",))
    version.model_path.unlink()  # and then gone: loading reads only the checked bytes
    served, info = load_model_file(
        version.model_path, allowed_tasks=("tiny_task:make",), data=checked
    )
    assert info.path == version.model_path
    for name, value in served.state_dict().items():
        assert torch.equal(value, honest.state_dict()[name]), name
    assert any(
        not torch.equal(value, swapped.state_dict()[name])
        for name, value in served.state_dict().items()
    )
