"""A Ray instance of the calling test's own, for tests that call Flower's run_simulation."""

from __future__ import annotations

import os
import sys


def local_ray() -> None:
    """Start Ray on this machine alone. `ray.init()` without an address would join any
    cluster another process started here (`ray start`), and die with it; Flower's
    simulation engine then uses this instance."""
    import ray

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(sys.path)  # the workers import the tests' apps by name
    os.environ["PYTHONPATH"] = pythonpath
    ray.init(
        address="local",
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        logging_level="error",
    )
