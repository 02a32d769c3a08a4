"""The CLI end to end on a tiny config, and a non-editable install importing."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from wheel_build import build_wheel, install_wheel

from fedveil.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def fedveil(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedveil.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.procs
def test_simulate_writes_the_run_directory(tmp_path, tiny_env):
    out = tmp_path / "run"
    proc = fedveil(
        "simulate",
        "--task",
        "tiny_task:make",
        "--clients",
        "10",
        "--per-round",
        "3",
        "--rounds",
        "3",
        "--seed",
        "2",
        "--out",
        str(out),
        "--json",
        env=tiny_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["rounds"] == 3 and summary["clients"] == 10
    # Values, not only keys: a NaN loss or an accuracy out of [0, 1] fails here.
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert 0.0 < summary["test_loss"] < 10.0  # NaN fails both comparisons
    assert summary["wall_s"] > 0 and summary["transport"] == "inprocess"
    assert summary == json.loads((out / "summary.json").read_text())
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2, 3]
    assert (out / "model.safetensors").stat().st_size > 0
    config = (out / "config.toml").read_text()
    assert "seed = 2" in config and 'task = "tiny_task:make"' in config
    assert "round" in proc.stderr  # the progress bar


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rounds", "-1"], "server.rounds = -1: must be >= 1"),
        (["--alpha", "0"], "data.alpha = 0.0: must be > 0.0"),
        (["--model", "resnet999", "--dataset", "digits"], "model.name = 'resnet999': unknown"),
        (["--clients", "10", "--per-round", "11"], "more sampled clients than exist"),
        (["--set", "server.nope=1"], "unknown key server.nope"),
        (
            ["--data-dir", "/nonexistent", "--set", "data.dataset=fashion-mnist"],
            "dataset-fashion-mnist",
        ),
    ],
)
def test_bad_config_fails_before_training_naming_the_field(
    tmp_path, monkeypatch, capsys, args, message
):
    # In process (main([...]) is the console script's body): a subprocess would spend its
    # time importing torch.
    monkeypatch.setenv("FEDVEIL_DATA", str(tmp_path / "nothing"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--out", str(tmp_path / "r"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.procs
@pytest.mark.timeout(900)  # a wheel build and an install, 300 s each at most
def test_regular_install_imports_under_one_namespace(tmp_path):
    # Built from a copy of the sources: pip would otherwise write build/ and the
    # egg-info into this checkout (tests/wheel_build.py).
    wheel = build_wheel(tmp_path / "wheel")
    target = install_wheel(wheel, tmp_path / "site")
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info"))
    assert top == ["bin", "fedveil"] or top == ["fedveil"], top
    code = (
        "import fedveil.server.engine.rounds, fedveil.client.runtime, fedveil.privacy, "
        "fedveil.simulations.inprocess, fedveil.cli.main; "
        "print(fedveil.server.engine.rounds.__file__)"
    )
    env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    # -I ignores PYTHONPATH, so run without it but with an explicit sys.path instead
    proc = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = {[str(target)]}; {code}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert str(target) in proc.stdout
