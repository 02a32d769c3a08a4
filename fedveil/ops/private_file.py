"""Write a secret (a private key, an auth secret) as a new file only its owner can read.

`os.open(path, O_CREAT | O_TRUNC, 0o600)` is private only when it creates the file: over
an existing file it keeps that file's mode (a key written over a 0644 file is readable by
others until a later chmod), and it follows a link, so a link planted in a shared folder
sends the secret into a file of the planter's choosing. `write_private_file` unlinks
whatever is at the path first and creates the file exclusively, mode 0600, without
following a link; a path it cannot replace raises OSError naming the path, before any
byte of the secret is written. `replace_private_file` does the same through a rename, so
that the old content is never lost before the new one is on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_FILE_MODE = 0o600


def write_private_file(path: Path, data: bytes) -> None:
    """`data` in a new file at `path` of mode 0600 (see the module doc)."""
    try:
        path.unlink(missing_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError as exc:
        raise OSError(
            f"{path}: cannot write it as a new file of mode 0600 ({exc.strerror}); "
            "write secrets to a folder only you can write"
        ) from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), PRIVATE_FILE_MODE)  # whatever the umask
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # on disk before a caller relies on it (or renames it)


def replace_private_file(path: Path, data: bytes) -> None:
    """`data` at `path`, mode 0600, replacing any old content atomically: a crash leaves
    the old file or the new one, never neither nor a torn one (a record that must not be
    lost, such as a count a privacy limit relies on). Written to a private sibling first,
    fsynced, renamed over `path`, and the rename fsynced with its folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_private_file(tmp, data)
    try:
        os.replace(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as exc:
        raise OSError(f"{path}: cannot replace it ({exc.strerror})") from None
