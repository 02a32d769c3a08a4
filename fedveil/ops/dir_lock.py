"""One process per directory: an exclusive, non-blocking flock on a 0600 lock file in it.

Contract: `hold_lock(path)` returns the open descriptor holding the lock (close it to
release), or None when another process holds it. The lock goes with the process, even on
SIGKILL, so a crash never leaves a directory locked. Callers word their own refusal.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def hold_lock(path: Path) -> int | None:
    """The descriptor locking `path` (created 0600 if missing), or None if it is held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
