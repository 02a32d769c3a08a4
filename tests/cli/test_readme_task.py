"""The bring-your-own-model tutorial (docs/tutorials/bring-your-own-model.md) runs as it
stands (issue 19): its code block is the task module, its command line the run (with fewer
rounds)."""

from __future__ import annotations

import json
import re
import shlex

import tomllib
from docs_pages import code_blocks, section

from fedveil.cli.main import main

PAGE = "tutorials/bring-your-own-model.md"


def example() -> tuple[str, str]:
    """The tutorial's Python block (step 1) and its `fedveil simulate` line (step 2)."""
    code = code_blocks(section(PAGE, "1. Write the task"), "python")
    command = [c for c in code_blocks(section(PAGE, "2. Run it"), "sh") if c.startswith("fedveil")]
    assert code and command, f"docs/{PAGE} lost its example"
    return code[0], command[0].strip()


def test_the_readme_custom_task_runs_as_it_stands(tmp_path, monkeypatch, capsys):
    code, command = example()
    module = re.match(r"# (\w+)\.py\n", code)
    assert module, "the example's first line names its file"
    (tmp_path / f"{module.group(1)}.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # as a user runs it: the module in the current directory
    argv = shlex.split(command)[1:]
    argv[argv.index("--rounds") + 1] = "2"
    status = main([*argv, "--quiet", "--json", "--set", "simulation.workers=1"])
    out, err = capsys.readouterr()
    assert status == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["rounds"] == 2 and summary["test_accuracy"] is not None
    run = tmp_path / argv[argv.index("--out") + 1]
    config = tomllib.loads((run / "config.toml").read_text())
    assert config["model"]["task"] == "my_task:make"
    assert config["data"]["num_clients"] == int(argv[argv.index("--clients") + 1])
