"""tests/local_ray.py: the session's Ray imports the tests' modules by name, and the
PYTHONPATH it needs for that does not leak into the environment of later tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.procs, pytest.mark.timeout(180)]

TESTS = Path(__file__).resolve().parent

# In a fresh interpreter: Ray is not started yet there (in this session it may be).
SCRIPT = textwrap.dedent(
    """
    import os
    import ray
    from local_ray import local_ray
    before = os.environ.get("PYTHONPATH")
    local_ray()
    try:
        @ray.remote(num_cpus=0)
        def imports_a_test_module():
            import tiny_task  # on the tests' sys.path only
            return tiny_task.__name__
        print("worker imported", ray.get(imports_a_test_module.remote(), timeout=120))
        print("environment restored", os.environ.get("PYTHONPATH") == before)
    finally:
        ray.shutdown()
    """
)


def test_local_ray_keeps_pythonpath_to_ray_and_out_of_the_session():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "worker imported tiny_task" in done.stdout
    assert "environment restored True" in done.stdout, done.stdout
