"""A Ray instance of the calling test's own, for tests that call Flower's run_simulation.

Contract: `local_ray()` leaves this process's environment as it found it. Ray's workers
import the tests' apps by name, so the processes `ray.init` starts get this process's
sys.path as PYTHONPATH (their environment, and the job's runtime_env); no other
subprocess a later test starts sees it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def scoped_env(name: str, value: str) -> Iterator[None]:
    """`name=value` in os.environ inside the block only (the children started there keep it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def local_ray() -> None:
    """Start Ray on this machine alone. `ray.init()` without an address would join any
    cluster another process started here (`ray start`), and die with it; Flower's
    simulation engine then uses this instance."""
    import ray

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(sys.path)  # the workers import the tests' apps by name
    # Ray's own processes (GCS, raylet, and the workers the raylet forks) inherit it.
    with scoped_env("PYTHONPATH", pythonpath):
        ray.init(
            address="local",
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            logging_level="error",
        )
