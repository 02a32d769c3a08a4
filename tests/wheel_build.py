"""fedveil's wheel, built for real from a copy of this checkout's sources in a folder of the
test's own.

Built from the checkout itself, pip (setuptools, without build isolation) would write
build/ and fedveil.egg-info/ into the checkout: a stale build/ from an older tree could
leak removed modules into the wheel, and the egg-info that the editable install of the
same checkout reads its entry points from would be rewritten while other test sessions
run. The copy leaves the checkout untouched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (
    "pyproject.toml",
    "README.md",
    "fedveil",
    "server",
    "client",
    "privacy",
    "simulations",
    "benchmarks",
)
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check", "-q")


def _ignore(_folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}


def build_wheel(work: Path, timeout_s: float = 300) -> Path:
    """Copy the sources into `work`/src, build the wheel there; the wheel's path."""
    src = work / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=_ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    build = [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work), str(src)]
    subprocess.run(build, check=True, capture_output=True, timeout=timeout_s)
    (wheel,) = work.glob("fedveil-*.whl")
    return wheel


def install_wheel(wheel: Path, target: Path, timeout_s: float = 300) -> Path:
    """pip install --target: the wheel alone, without its dependencies."""
    install = [*PIP, "install", "--no-deps", "--no-compile", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=timeout_s)
    return target
