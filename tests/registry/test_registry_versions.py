"""Versions, promotion and references, as an operator uses them (the registry API and
`fedveil models`), including two processes registering at once."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedveil.cli.main import main
from fedveil.server.registry import PRODUCTION, REGISTERED, Registry, RegistryError


def test_register_promote_and_resolve(tmp_path: Path, plain_run: Path) -> None:
    registry = Registry(tmp_path / "reg")
    first = registry.register(plain_run)
    second = registry.register(plain_run)
    assert (first.name, first.version, second.version) == ("tiny-blobs", 1, 2)
    assert registry.names() == ["tiny-blobs"]
    assert [v.version for v in registry.versions("tiny-blobs")] == [1, 2]
    # The registry keeps its own copy of the model, byte for byte the run's.
    assert first.model_path != plain_run / "model.safetensors"
    assert first.model_path.read_bytes() == (plain_run / "model.safetensors").read_bytes()
    assert (
        first.card["source"]["model_sha256"]
        == hashlib.sha256(first.model_path.read_bytes()).hexdigest()
    )
    assert first.run_dir == plain_run.resolve() and first.task == "tiny-blobs"

    assert registry.promoted("tiny-blobs") is None
    with pytest.raises(RegistryError, match=r"'tiny-blobs'.*no promoted version"):
        registry.resolve("tiny-blobs")
    registry.promote("tiny-blobs", 1)
    for ref in ("tiny-blobs", "tiny-blobs@production"):
        assert registry.resolve(ref).version == 1
        assert registry.resolve(ref).stage == PRODUCTION
    assert registry.resolve("tiny-blobs@2").stage == REGISTERED
    assert registry.resolve("tiny-blobs@latest").version == 2
    registry.promote("tiny-blobs", 2)  # promotion moves: one production version per name
    assert [v.stage for v in registry.versions("tiny-blobs")] == [REGISTERED, PRODUCTION]
    with pytest.raises(RegistryError, match="tiny-blobs@7: no such version"):
        registry.promote("tiny-blobs", 7)


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("tiny-blobs@9", "no such version"),
        ("nothing@1", "no model named 'nothing'"),
        ("tiny-blobs@newest", "expected a version number, 'production' or 'latest'"),
        ("Tiny Blobs@1", "model name 'Tiny Blobs'"),
        ("../etc@1", "model name '../etc'"),
    ],
)
def test_a_bad_reference_is_named(tmp_path: Path, plain_run: Path, ref: str, why: str) -> None:
    registry = Registry(tmp_path / "reg")
    registry.register(plain_run)
    with pytest.raises(RegistryError) as error:
        registry.resolve(ref)
    assert repr(ref) in str(error.value) and why in str(error.value)


def test_models_cli(tmp_path: Path, plain_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reg = ["--registry", str(tmp_path / "reg")]
    assert main(["models", "register", str(plain_run), "--name", "blobs", *reg]) == 0
    assert main(["models", "promote", "blobs", "1", *reg]) == 0
    capsys.readouterr()
    assert main(["models", "list", "blobs", "--json", *reg]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["ref"] == "blobs@1" and rows[0]["stage"] == PRODUCTION
    assert main(["models", "show", "blobs", *reg]) == 0
    shown = capsys.readouterr().out
    assert "blobs@1 (production)" in shown and "No differential privacy" in shown
    assert main(["models", "show", "blobs@4", *reg]) == 2
    assert "'blobs@4'" in capsys.readouterr().err


def test_a_round_the_run_does_not_keep_is_refused_saying_what_it_keeps(
    tmp_path: Path, plain_run: Path
) -> None:
    registry = Registry(tmp_path / "reg")
    with pytest.raises(RegistryError, match=r"round 1's model is not kept.*round\(s\) 2"):
        registry.register(plain_run, round_num=1)
    assert registry.register(plain_run, round_num=2).card["rounds"] == 2


def test_the_checkpoint_round_is_named_as_the_model_is(tmp_path: Path, plain_run: Path) -> None:
    """A run whose checkpoint holds another round than its model file (resumed, still
    running): that round's flat weights are split into the model's named tensors."""
    import shutil

    run = Path(shutil.copytree(plain_run, tmp_path / "run"))
    state = torch.load(run / "checkpoint" / "state.pt", weights_only=False)
    state["round"], state["weights"] = 1, torch.arange(state["weights"].numel()).float()
    torch.save(state, run / "checkpoint" / "state.pt")
    version = Registry(tmp_path / "reg").register(run, round_num=1)
    assert version.card["rounds"] == 1
    tensors, final = load_file(version.model_path), load_file(run / "model.safetensors")
    assert {k: t.shape for k, t in tensors.items()} == {k: t.shape for k, t in final.items()}
    # Module order (FlatModel's), not the file's sorted order: the first layer's weight first.
    assert tensors["0.weight"].flatten()[0] == 0 and tensors["0.bias"][0] == 16 * 8


REGISTER_LOOP = """
import sys, time
from pathlib import Path
from fedveil.server.registry import Registry
from fedveil.server.registry.store import RegistryFiles

write_version = RegistryFiles.write_version

def slow_write(self, *args):  # a slow disk: the other process runs meanwhile
    time.sleep(0.3)
    return write_version(self, *args)

RegistryFiles.write_version = slow_write
registry = Registry(Path(sys.argv[1]))
sys.stdin.readline()  # both processes start together
for _ in range(int(sys.argv[3])):
    registry.register(Path(sys.argv[2]), name="race")
"""


@pytest.mark.procs
def test_two_processes_registering_at_once_lose_no_version(tmp_path: Path, plain_run: Path) -> None:
    root, each = tmp_path / "reg", 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REGISTER_LOOP, str(root), str(plain_run), str(each)],
            stdin=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    registry = Registry(root)
    assert [v.version for v in registry.versions("race")] == list(range(1, 2 * each + 1))
    assert all(v.card["version"] == v.version for v in registry.versions("race"))
