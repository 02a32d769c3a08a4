"""fedveil's benchmarks: run from a source checkout, never shipped in the wheel.

`fedveil bench simulation|secagg` runs them (it finds this folder next to the
editable package, or at $FEDVEIL_BENCHMARKS); so does `python -m
benchmarks.<module>` from the repository root. They may import any part of
fedveil; nothing in fedveil imports them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

# The checkout's root: the folder that holds `benchmarks/`.
ROOT = Path(__file__).resolve().parent.parent


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's) in which a child process can import
    `benchmarks` from any working directory: the checkout's root leads PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
    return out


@contextlib.contextmanager
def run_directory(path: Path | None = None) -> Iterator[Path]:
    """Where a contender's run writes what `fedveil simulate` writes (metrics, checkpoint,
    model, summary): `path`, kept, or a temporary folder removed afterwards."""
    if path is not None:
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="fedveil-bench-") as tmp:
        yield Path(tmp)
