"""The README's Model registry snippet runs as it stands, against a finished run."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"


def snippet() -> str:
    section = README.read_text().split("### Model registry", 1)[1].split("\n### ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "the README's 'Model registry' section lost its code block"
    return code.group(1)


def test_the_readme_registry_snippet_runs(
    tmp_path: Path, plain_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(plain_run, tmp_path / "runs" / "latest")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDVEIL_REGISTRY", str(tmp_path / "registry"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet(), "README.md", "exec"), {})
    ref, epsilon, accuracy = printed.getvalue().split()
    assert ref == "fashion@1" and epsilon == "None" and float(accuracy) > 0
    assert (tmp_path / "registry" / "fashion" / "v1" / "card.json").is_file()
