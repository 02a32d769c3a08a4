"""Where each round's record lies in a run's JSONL file, so a page of rounds costs the
page, not the run.

`GET /runs/{id}/rounds?since=&limit=` (routes/rounds_api.py) used to parse the whole
metrics.jsonl (or private/rounds.jsonl) on every request: a dashboard polling a long
run did work growing with its length. A `RoundIndex` keeps, per file, the byte offset
and length of each round's last complete line (sorted by round), extended from where
it stopped by reading only the bytes appended since; a page is then a bisection and
one read per record. A file rewritten in place of the old one (resume truncation:
a new inode) or shorter than what was indexed is indexed again from its start. A line
being appended (no newline yet) waits for the next request; a complete line that is
not a JSON object with an integer `round` is not indexed.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Record = dict[str, Any]


@dataclass
class _FileIndex:
    identity: tuple[int, int]  # (st_dev, st_ino): a rewritten file is another file
    indexed: int = 0  # bytes of complete lines read so far
    rounds: list[int] = field(default_factory=list)  # sorted
    where: dict[int, tuple[int, int]] = field(default_factory=dict)  # round -> (offset, len)


class RoundIndex:
    """Round records of JSONL files by round number; `keep` says which records count
    (e.g. not the private annex's charge records). Thread-safe (handlers run in a pool)."""

    def __init__(self, keep: Callable[[Record], bool] = lambda record: True) -> None:
        self._keep = keep
        self._files: dict[Path, _FileIndex] = {}
        self._lock = threading.Lock()

    def page(self, path: Path, since: int, limit: int) -> list[Record]:
        """Up to `limit` records of rounds after `since`, in round order (the last line
        written for a round); [] when the file does not exist."""
        with self._lock:
            try:
                with path.open("rb") as f:
                    index = self._updated(path, f)
                    start = bisect.bisect_right(index.rounds, since)
                    out = []
                    for r in index.rounds[start : start + limit]:
                        offset, length = index.where[r]
                        f.seek(offset)
                        out.append(json.loads(f.read(length)))
                    return out
            except FileNotFoundError:
                self._files.pop(path, None)
                return []

    def _updated(self, path: Path, f: Any) -> _FileIndex:
        st = os.fstat(f.fileno())  # the file read, not whatever the path names by now
        identity = (st.st_dev, st.st_ino)
        index = self._files.get(path)
        if index is None or index.identity != identity or st.st_size < index.indexed:
            index = self._files[path] = _FileIndex(identity)
        f.seek(index.indexed)
        offset = index.indexed
        for line in f:
            if not line.endswith(b"\n"):
                break  # being appended right now: the next request reads it
            self._add(index, line, offset)
            offset += len(line)
        index.indexed = offset
        return index

    def _add(self, index: _FileIndex, line: bytes, offset: int) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict) or not self._keep(record):
            return
        r = record.get("round")
        if not isinstance(r, int) or isinstance(r, bool):
            return
        if r not in index.where:
            bisect.insort(index.rounds, r)
        index.where[r] = (offset, len(line))
