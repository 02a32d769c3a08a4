"""The Fleet listener's counters, shared between the SuperLink process and `fedveil server`.

The Fleet API is served inside the SuperLink's process (fleet_listener.py), but /metrics
is served by `fedveil server`. The counters therefore live in a small owner-only file in
the state dir, mapped into both: the SuperLink process adds to it (one event loop, one
writer), `fedveil server` reads it when /metrics is scraped. Fixed slots of unsigned
64-bit integers: requests served, body bytes in and out, then one per refusal reason
(`REASONS`), then the PullMessages answered from memory (idle_polls.py; they are also
counted as served). The file survives a SuperLink restart, so the counts keep growing since
`fedveil server` started, as Prometheus expects of counters.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from pathlib import Path

# Every reason the gateway refuses a Fleet request with (gateway.py).
REASONS = ("not_fleet", "busy", "too_large", "bad_request", "upstream")
_IDLE_SLOT = 3 + len(REASONS)
_SLOTS = _IDLE_SLOT + 1
_FORMAT = f"<{_SLOTS}Q"
SIZE = struct.calcsize(_FORMAT)
FILE_NAME = "fleet-counters.bin"


class FleetCounterFile:
    """`SIZE` bytes at `path`, mapped shared; `create` zeroes it, `open` keeps its counts."""

    def __init__(self, path: Path, *, create: bool) -> None:
        flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if os.fstat(fd).st_size != SIZE:
                os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the file
        self.path = path

    def _add(self, slot: int, n: int) -> None:
        offset = slot * 8
        (value,) = struct.unpack_from("<Q", self._map, offset)
        struct.pack_into("<Q", self._map, offset, value + n)

    def served(self, bytes_in: int, bytes_out: int) -> None:
        self._add(0, 1)
        self._add(1, bytes_in)
        self._add(2, bytes_out)

    def refused(self, reason: str) -> None:
        self._add(3 + REASONS.index(reason), 1)

    def idle_answered(self) -> None:
        self._add(_IDLE_SLOT, 1)

    def idle_count(self) -> int:
        (value,) = struct.unpack_from("<Q", self._map, _IDLE_SLOT * 8)
        return int(value)

    def snapshot(self) -> tuple[int, Counter[str], int, int]:
        """(requests, refusals by reason, bytes in, bytes out)."""
        values = struct.unpack_from(_FORMAT, self._map, 0)
        refused = Counter({r: v for r, v in zip(REASONS, values[3:_IDLE_SLOT], strict=True) if v})
        return values[0], refused, values[1], values[2]

    def close(self) -> None:
        self._map.close()
