"""The device's SuperExec auth secret (whoever reads it claims the device's tasks from
its SuperNode on loopback) is a new file of mode 0600 every start, whatever was there."""

from __future__ import annotations

import os
import stat

import pytest

from fedveil.client.edge.edge import write_runtime_secret


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_old_world_readable_secret_file_is_replaced_by_a_private_one(tmp_path):
    path = tmp_path / "runtime.secret"
    path.write_bytes(b"old")
    os.chmod(path, 0o644)  # a state directory copied or restored with its modes
    secret = write_runtime_secret(path)
    assert _mode(path) == 0o600 and path.read_bytes() == secret and len(secret) == 32
    assert write_runtime_secret(path) != secret  # fresh from the CSPRNG each start


def test_a_planted_link_is_not_followed(tmp_path):
    target = tmp_path / "planted"
    target.write_bytes(b"")
    os.chmod(target, 0o666)  # another user's file, readable by them
    path = tmp_path / "runtime.secret"
    path.symlink_to(target)
    secret = write_runtime_secret(path)
    assert target.read_bytes() == b""  # the secret never reached the planted file
    assert not path.is_symlink() and _mode(path) == 0o600 and path.read_bytes() == secret


def test_a_secret_that_cannot_be_replaced_fails_the_start_naming_the_file(tmp_path):
    path = tmp_path / "runtime.secret"
    path.mkdir()  # not a file this device can unlink as one
    with pytest.raises(OSError, match=r"runtime.secret: cannot write the SuperNode's auth secret"):
        write_runtime_secret(path)
