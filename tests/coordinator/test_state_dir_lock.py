"""One coordinator per state directory: the second is refused with the way out."""

from __future__ import annotations

import os

import pytest

from fedveil.config import ConfigError
from fedveil.server.coordinator.service import lock_state_dir


def test_a_second_server_on_a_state_dir_in_use_is_told_what_to_do(tmp_path):
    held = lock_state_dir(tmp_path / "state")
    try:
        with pytest.raises(ConfigError, match="another fedveil server is using it") as err:
            lock_state_dir(tmp_path / "state")
        assert "stop that server first" in str(err.value) and "--state-dir" in str(err.value)
    finally:
        os.close(held)
    os.close(lock_state_dir(tmp_path / "state"))  # free again once the first one stops
