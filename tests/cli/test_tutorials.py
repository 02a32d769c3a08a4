"""The tutorials' commands run as the pages give them (docs/tutorials/): every `fedveil`
line of a page's shell blocks goes through `fedveil.cli.main.main` in this process, in a
fresh directory, with only the run's size cut (rounds) and one worker; files the pages
write with heredocs are written from the page's own text. The coordinator tutorial runs
up to what needs no deployment: the suite's deployments run the rest."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest
import tomllib
from docs_pages import code_blocks, page, section

from fedveil.cli.main import main
from fedveil.config.service_settings import service_config
from fedveil.server.coordinator.runs import parse_submission

QUICK = ["--quiet", "--set", "simulation.workers=1", "--set", "simulation.plots=false"]


def commands(name: str, heading: str | None = None) -> list[list[str]]:
    """Each `fedveil ...` command of the page's (or section's) sh blocks, as argv after
    `fedveil`; backslash continuations joined, comments dropped."""
    text = section(name, heading) if heading else page(name)
    argvs = []
    for block in code_blocks(text, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["fedveil"]:
                argvs.append(words[1:])
    assert argvs, f"docs/{name}: no fedveil command found"
    return argvs


def heredocs(block: str) -> dict[str, str]:
    """`cat > FILE <<'END' ... END` (and `python - <<'END'`) bodies of a shell block, by
    file name (`-` for the Python script)."""
    found = re.findall(r"^(?:cat > (\S+)|python (-)) <<'(\w+)'\n(.*?)^\3$", block, re.S | re.M)
    return {file or dash: body for file, dash, _, body in found}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 0, (argv, err[-2000:])
    return out


def with_rounds(argv: list[str], rounds: int) -> list[str]:
    argv = list(argv)
    if "--rounds" in argv:
        argv[argv.index("--rounds") + 1] = str(rounds)
    return argv


def test_first_simulation_tutorial(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argvs = commands("tutorials/first-simulation.md")
    assert [a[0] for a in argvs] == ["simulate", "data", "simulate", "simulate"]
    first, report, again, resume = argvs
    run([*with_rounds(first, 3), *QUICK], capsys)
    summary = json.loads(Path("runs/first/summary.json").read_text())
    assert summary["rounds"] == 3 and 0.0 <= summary["test_accuracy"] <= 1.0
    assert len(Path("runs/first/metrics.jsonl").read_text().splitlines()) == 3
    assert run(report, capsys).strip(), "fedveil data report printed nothing"
    run([*again, *QUICK], capsys)
    rerun = tomllib.loads(Path("runs/again/config.toml").read_text())
    assert rerun["server"]["rounds"] == 2 and rerun["data"]["num_clients"] == 20
    # The page's "cat" and "head" lines read files that exist.
    assert Path("runs/first/metrics.jsonl").stat().st_size > 0
    # Step 6: resume (of a finished run: nothing left to train), under its own config.
    assert "--resume" in resume
    recorded = Path("runs/first/config.toml").read_bytes()
    run([*resume, *QUICK], capsys)
    assert Path("runs/first/config.toml").read_bytes() == recorded
    assert json.loads(Path("runs/first/summary.json").read_text())["rounds"] == 3


@pytest.mark.slow
def test_first_private_run_tutorial(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argvs = commands("tutorials/first-private-run.md")
    assert [a[0] for a in argvs] == ["simulate", "privacy", "privacy"]
    assert [a[1] for a in argvs[1:]] == ["report", "verify"]
    train, report, verify = argvs
    run([*with_rounds(train, 2), *QUICK], capsys)
    printed = run(report, capsys)
    assert "observers: epsilon" in printed and "trusted curator" in printed
    public = json.loads(Path("runs/private/privacy/report.json").read_text())
    epsilon = public["adversaries"]["observers"]["epsilon"]
    assert 0 < epsilon <= 8.0 and public["adversaries"]["coordinator"]["epsilon"] is None
    assert public["cohort_source"] == "csprng"
    assert Path("runs/private/privacy/report.html").is_file()
    assert run(verify, capsys).startswith("OK: final")
    # What the page says of an edited ledger: verify then fails (exit 1).
    ledger = Path("runs/private/privacy/ledger.jsonl")
    lines = ledger.read_text().splitlines()
    entry = json.loads(lines[0])
    entry["epsilon"] = float(entry.get("epsilon") or 0) + 1.0
    ledger.write_text("\n".join([json.dumps(entry), *lines[1:]]) + "\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(verify) == 1


def test_coordinator_tutorial_up_to_the_deployment(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name = "tutorials/coordinator-and-devices.md"
    first = code_blocks(section(name, "Try it on one machine"), "sh")[0]
    private = code_blocks(section(name, "The same devices with secure aggregation and DP"), "sh")[0]
    files = heredocs(first) | heredocs(private)
    assert set(files) == {"server.toml", "-", "run.toml", "private-run.toml"}, set(files)
    certs = next(a for a in commands(name) if a[0] == "certs")
    run(certs, capsys)
    for i in range(3):
        assert Path(f"certs/clients/client-{i}.key").is_file()
    service = service_config(tomllib.loads(files["server.toml"]))
    assert service.tls.cert == "certs/server.pem" and service.fleet.port == 9092
    exec(compile(files["-"], f"docs/{name}", "exec"), {})  # the devices' data
    for i in range(3):
        assert Path(f"device-{i}.npz").stat().st_size > 0
    for toml in ("run.toml", "private-run.toml"):
        cfg, deploy, _ = parse_submission(files[toml].encode(), "application/toml", [])
        assert cfg.data.num_clients == 3 and deploy.wait_for_clients == 3
    cfg, _, _ = parse_submission(files["private-run.toml"].encode(), "application/toml", [])
    assert cfg.secagg.enabled and cfg.dp.mechanism == "central"
