"""The wheel carries the benchmarks (`fedveil.benchmarks`): `fedveil bench` runs them from
an install, with no source checkout.

The wheel is built for real from a copy of this checkout (a stale build/ folder next to the
sources cannot leak into it) and installed with pip; `fedveil` then runs from that install,
from a folder outside the checkout, as it would on a user's machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel_build import build_wheel, install_wheel

# Building and installing the wheel (module fixture) may take 2 x 300 s, then each test's
# own commands up to 300 s: the limit sits above both.
pytestmark = [pytest.mark.procs, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, a folder where it is installed without dependencies)."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(work)  # from a copy of the sources (tests/wheel_build.py)
    return wheel, install_wheel(wheel, work / "site")


def _fedveil(site: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The wheel's folder comes first on sys.path: it shadows the editable install of this
    # checkout (whose finder only answers after the path entries).
    environ.update(PYTHONPATH=str(site), **env)
    return subprocess.run(
        [sys.executable, "-m", "fedveil.cli.main", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_wheel_ships_the_benchmarks_as_a_package(wheel_install):
    wheel, _site = wheel_install
    names = zipfile.ZipFile(wheel).namelist()
    assert "fedveil/simulations/inprocess.py" in names
    modules = {path.name for path in (ROOT / "benchmarks").glob("*.py")}
    assert {"bench_secagg_round.py", "flower_peer.py", "harness.py"} <= modules
    assert {f"fedveil/benchmarks/{m}" for m in modules} <= set(names)
    assert [n for n in names if n.startswith("benchmarks/")] == []  # nothing at the top


def test_from_the_wheel_bench_runs_without_a_checkout(wheel_install, tmp_path):
    _wheel, site = wheel_install
    run = subprocess.run(
        [sys.executable, "-c", "import fedveil.benchmarks as b; print(b.__file__)"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )
    assert run.stdout.strip().startswith(str(site))  # the wheel's, not this checkout's
    helped = _fedveil(site, tmp_path, "bench", "secagg", "--help")
    assert helped.returncode == 0 and "--drop-stage" in helped.stdout  # the benchmark's flags
    flags = "--clients 6 --dim 1000 --dropout 0.17 --seed 3 --rounds 2 --transport inprocess"
    proc = _fedveil(site, tmp_path, "bench", "secagg", *flags.split(), "--no-compute", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["clients"], out["neighbors"], out["threshold"], out["dropped"]) == (6, 5, 2, 1)
    assert out["checks"]["fedveil"]["secagg_ok"]
