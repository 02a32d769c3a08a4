"""fedveil's benchmarks: the package `fedveil.benchmarks` (benchmarks/ in a checkout,
mapped like server/ is to `fedveil.server`), shipped in the wheel.

`fedveil bench BENCHMARK` runs one (fedveil/cli/bench.py lists them); so does
`python -m fedveil.benchmarks.bench_X`. Each module owns its flags and constants and
shares the command line and the contender runner (harness.py). Benchmarks may import
any part of fedveil below the entry points; only the entry points (fedveil.cli) import
them (import-linter's layers contract).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's) for a contender's process. The package
    is installed, so a child imports `fedveil.benchmarks` from any working directory
    without a PYTHONPATH of its own."""
    return dict(os.environ if env is None else env)


@contextlib.contextmanager
def run_directory(path: Path | None = None) -> Iterator[Path]:
    """Where a contender's run writes what `fedveil simulate` writes (metrics, checkpoint,
    model, summary): `path`, kept, or a temporary folder removed afterwards."""
    if path is not None:
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="fedveil-bench-") as tmp:
        yield Path(tmp)
