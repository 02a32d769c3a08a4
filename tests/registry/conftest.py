from __future__ import annotations

from pathlib import Path

import pytest
from registry_runs import tiny_run


@pytest.fixture(scope="session")
def dp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished central-DP run; tests that tamper with it work on a copy."""
    return tiny_run(tmp_path_factory.mktemp("runs") / "dp", dp=True)


@pytest.fixture(scope="session")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run without DP."""
    return tiny_run(tmp_path_factory.mktemp("runs") / "plain", dp=False)
