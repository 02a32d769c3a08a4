"""The README's custom-task example runs as it stands (issue 19): its code block is the
task module, its command line the run (with fewer rounds)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import tomllib

from fedveil.cli.main import main

README = Path(__file__).parents[2] / "README.md"


def example() -> tuple[str, str]:
    """The 'Custom tasks' section's Python block and its `fedveil simulate` line."""
    text = README.read_text()
    section = text.split("### Custom tasks", 1)[1].split("\n### ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    command = re.search(r"```sh\n(fedveil simulate .*?)\n```", section, re.S)
    assert code and command, "the README's Custom tasks section lost its example"
    return code.group(1), command.group(1)


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
