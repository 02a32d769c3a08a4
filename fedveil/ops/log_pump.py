"""A child process's output written to a log file that cannot grow without bound.

The coordinator captures the SuperLink's whole output (Flower's own `--log-file`
rotation does not apply to it), and unauthenticated garbage requests or an idle
SuperLink's once-a-second polling lines would otherwise fill the disk. `LogPump` reads
the child's output on a thread and writes it:

- rotated: at `max_bytes` the file becomes `NAME.1` (older ones shift, up to `backups`);
- rate-limited: a line whose shape (its text with the digits and the leading timestamp
  masked) repeats more than `burst` times within `window_s` is held back, and one line
  says how many were left out when the window ends or another line comes.

Lines are cut at `max_line` bytes. Writing never blocks the child beyond the pipe.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 3
BURST = 5
WINDOW_S = 60.0
MAX_LINE = 8192
_DIGITS = re.compile(rb"\d+")


def line_shape(line: bytes) -> bytes:
    """What makes two log lines 'the same': the text with every number masked."""
    return _DIGITS.sub(b"#", line.strip())


class RotatingLog:
    """Appends lines to `path`, rotating at `max_bytes` into `backups` older files and
    collapsing repeats (module doc). Not thread-safe: one writer (the pump)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = MAX_BYTES,
        backups: int = BACKUPS,
        burst: int = BURST,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if max_bytes < 1024 or backups < 1 or burst < 1 or not window_s > 0:
            raise ValueError("RotatingLog: max_bytes >= 1024, backups >= 1, burst >= 1, window > 0")
        self.path, self.max_bytes, self.backups = Path(path), max_bytes, backups
        self.burst, self.window_s = burst, window_s
        self._now = clock or time.monotonic
        self._file: IO[bytes] = self.path.open("ab")
        self._seen: dict[bytes, tuple[float, int]] = {}  # shape -> (window start, count)
        self._held: dict[bytes, int] = {}  # shape -> lines left out in its window

    def write_line(self, line: bytes) -> None:
        line = line.rstrip(b"\n")[:MAX_LINE] + b"\n"
        now = self._now()
        self._flush_expired(now)
        shape = line_shape(line)
        start, count = self._seen.get(shape, (now, 0))
        if now - start > self.window_s:
            start, count = now, 0
        self._seen[shape] = (start, count + 1)
        if count >= self.burst:
            self._held[shape] = self._held.get(shape, 0) + 1
            return
        self._write(line)

    def close(self) -> None:
        self._flush_expired(float("inf"))
        self._file.close()

    def _flush_expired(self, now: float) -> None:
        for shape in list(self._held):
            start, _ = self._seen[shape]
            if now - start > self.window_s:
                held = self._held.pop(shape)
                del self._seen[shape]
                text = shape[:200].decode("utf-8", "replace")
                self._write(f"[fedveil] {held} more lines like '{text}' left out\n".encode())

    def _write(self, data: bytes) -> None:
        if self._file.tell() + len(data) > self.max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self.path.open("ab")


class LogPump:
    """Reads a child's output stream to its end on a daemon thread, into a RotatingLog."""

    def __init__(self, stream: IO[bytes], log: RotatingLog) -> None:
        self.stream, self.log = stream, log
        self.thread = threading.Thread(target=self._run, name="log-pump", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for line in iter(self.stream.readline, b""):
                self.log.write_line(line)
        finally:
            self.log.close()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)
