from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # tests/tiny_task.py is importable as `tiny_task`


@pytest.fixture
def tiny_env() -> dict[str, str]:
    """Environment for a subprocess that must import the tiny task."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return env
