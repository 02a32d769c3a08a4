from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # tests/tiny_task.py is importable as `tiny_task`
# The checkout's benchmarks/ (outside the wheel) import as `benchmarks`, also under `pytest`.
if str(TESTS.parent) not in sys.path:
    sys.path.insert(1, str(TESTS.parent))


@pytest.fixture(autouse=True, scope="session")
def _temporary_key_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Ledger signing keys (and subprocesses') go to a temp store, never to ~."""
    saved = os.environ.get("FEDVEIL_KEY_DIR")
    os.environ["FEDVEIL_KEY_DIR"] = str(tmp_path_factory.mktemp("fedveil-keys"))
    yield
    if saved is None:
        os.environ.pop("FEDVEIL_KEY_DIR", None)
    else:
        os.environ["FEDVEIL_KEY_DIR"] = saved


@pytest.fixture
def tiny_env() -> dict[str, str]:
    """Environment for a subprocess that must import the tiny task."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return env
