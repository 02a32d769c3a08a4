"""Write a secret (a private key, an auth secret) as a new file only its owner can read.

`os.open(path, O_CREAT | O_TRUNC, 0o600)` is private only when it creates the file: over
an existing file it keeps that file's mode (a key written over a 0644 file is readable by
others until a later chmod), and it follows a link, so a link planted in a shared folder
sends the secret into a file of the planter's choosing. `write_private_file` unlinks
whatever is at the path first and creates the file exclusively, mode 0600, without
following a link; a path it cannot replace raises OSError naming the path, before any
byte of the secret is written. `replace_private_file` does the same through a rename, so
that the old content is never lost before the new one is on disk. `read_private_record`
reads such a file back as a JSON object, without following a link.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


def read_private_record(path: Path) -> dict[str, Any] | None:
    """The JSON object a `replace_private_file` record holds; None if there is no file.
    ValueError saying what is wrong for anything else (unreadable, a link, not JSON, not
    an object): a caller that relies on the record refuses rather than start afresh."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError, JSONDecodeError: ValueError
        raise ValueError(f"is not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"is not a JSON object ({type(data).__name__})")
    return data
