"""The Model registry snippet of docs/how-to/registry-and-serving.md runs as it stands,
against a finished run."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest
from docs_pages import code_blocks, section

PAGE = "how-to/registry-and-serving.md"


def snippet() -> str:
    code = code_blocks(section(PAGE, "Model registry"), "python")
    assert code, f"docs/{PAGE}: 'Model registry' lost its code block"
    return code[0]


def test_the_readme_registry_snippet_runs(
    tmp_path: Path, plain_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(plain_run, tmp_path / "runs" / "latest")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDVEIL_REGISTRY", str(tmp_path / "registry"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet(), f"docs/{PAGE}", "exec"), {})
    ref, epsilon, accuracy = printed.getvalue().split()
    assert ref == "fashion@1" and epsilon == "None" and float(accuracy) > 0
    assert (tmp_path / "registry" / "fashion" / "v1" / "card.json").is_file()
