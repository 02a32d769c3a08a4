"""Secrets a local user could read: every writer of one (the device's SuperExec auth
secret, a device's secure-aggregation identity key, a SuperNode authentication key)
leaves a new file of mode 0600, whatever was at the path: an old world-readable file
(a folder copied or restored with its modes) or a link another user planted."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from fedveil.client.edge.edge import write_runtime_secret
from fedveil.ops.certs import create_client_key
from fedveil.privacy.secagg.identity_files import write_identity_key


def _runtime_secret(folder: Path) -> Path:
    path = folder / "runtime.secret"
    write_runtime_secret(path)
    return path


def _identity_key(folder: Path) -> Path:
    return write_identity_key(folder, "device-3", force=True)[0]


def _supernode_key(folder: Path) -> Path:
    return create_client_key(folder, "device-3", force=True)[0]


WRITERS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "runtime-secret": (_runtime_secret, "runtime.secret"),
    "identity-key": (_identity_key, "device-3.identity.key"),
    "supernode-key": (_supernode_key, "device-3.key"),
}


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_secret_over_an_old_world_readable_file_is_private(tmp_path, writer):
    write, name = WRITERS[writer]
    old = tmp_path / name
    old.write_bytes(b"old")
    os.chmod(old, 0o644)
    path = write(tmp_path)
    assert path == old and _mode(path) == 0o600 and path.read_bytes() != b"old"


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_secret_never_goes_through_a_planted_link(tmp_path, writer):
    write, name = WRITERS[writer]
    planted = tmp_path / "planted"
    planted.write_bytes(b"")
    os.chmod(planted, 0o666)  # another user's file, readable by them
    (tmp_path / name).symlink_to(planted)
    path = write(tmp_path)
    assert planted.read_bytes() == b"" and _mode(planted) == 0o666
    assert not path.is_symlink() and _mode(path) == 0o600 and path.stat().st_size > 0


def test_a_secret_that_cannot_be_replaced_fails_naming_the_file(tmp_path):
    (tmp_path / "runtime.secret").mkdir()  # nothing this device can unlink as a file
    with pytest.raises(OSError, match=r"runtime.secret: cannot write it as a new file"):
        write_runtime_secret(tmp_path / "runtime.secret")
