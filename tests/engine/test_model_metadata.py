"""model.safetensors names what rebuilds its model, and the loading snippet of
docs/how-to/export.md runs as it stands on a real run's file (issue 19)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch
from docs_pages import code_blocks, section
from safetensors import safe_open
from safetensors.torch import load_file

import fedveil
from fedveil.cli.main import main

PAGE = "how-to/export.md"


def readme_snippet() -> str:
    code = code_blocks(section(PAGE, "Loading the model"), "python")
    assert code, f"docs/{PAGE}: 'Loading the model' lost its code block"
    return code[0]


def metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def test_the_readme_snippet_rebuilds_a_built_in_model_from_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the snippet reads runs/latest/, the default --out
    argv = ["simulate", "--dataset", "synthetic", "--model", "mlp", "--clients", "10"]
    argv += ["--per-round", "5", "--rounds", "2", "--quiet"]
    argv += ["--set", "simulation.workers=1", "--set", "simulation.plots=false"]
    assert main(argv) == 0
    path = tmp_path / "runs" / "latest" / "model.safetensors"
    meta = metadata(path)
    assert meta["model"] == "mlp" and meta["round"] == "2"
    assert meta["fedveil_version"] == fedveil.__version__
    assert meta["task"] == "synthetic/mlp"

    scope: dict[str, object] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(readme_snippet(), f"docs/{PAGE}", "exec"), scope)
    model = scope["model"]
    assert isinstance(model, torch.nn.Module)
    saved = load_file(path)
    assert set(model.state_dict()) == set(saved)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert "after round 2" in printed.getvalue()


def test_a_custom_task_model_names_its_task_ref_shape_and_classes(tmp_path):
    argv = ["simulate", "--task", "tiny_task:make", "--rounds", "1", "--quiet"]
    argv += ["--out", str(tmp_path / "run"), "--set", "simulation.workers=1"]
    argv += ["--set", "simulation.plots=false"]
    assert main(argv) == 0
    meta = metadata(tmp_path / "run" / "model.safetensors")
    assert meta["task_ref"] == "tiny_task:make"
    assert "model" not in meta  # no built-in model rebuilds it: its task function does
    assert json.loads(meta["input_shape"]) == [8] and meta["num_classes"] == "3"
    assert meta["round"] == "1"
