"""CPU and memory of a coordinator's process tree, read from /proc: one reading for every
contender of the Fleet benchmarks (fedveil's `fedveil server`, stock Flower's SuperLink).

`sample_tree(pid)` sums user + system CPU seconds (with the CPU of ended,
waited-for children: a run's ServerApp) and resident memory over `pid` and all its
descendants, and reports `pid`'s own CPU apart.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return kids


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (the coordinator, the SuperLink, SuperExec, ServerApps)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


@dataclass
class TreeSample:
    cpu_s: float  # user + system seconds of the tree's live processes and ended children
    rss_mb: float
    # the root process alone: for fedveil, `fedveil server` (API, run supervisor; the Fleet
    # path runs in its SuperLink child since issue 33); for stock Flower, its SuperLink
    root_cpu_s: float


def sample_tree(pid: int) -> TreeSample:
    cpu, rss, root = 0.0, 0, 0.0
    for p in process_tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            # utime, stime, and cutime, cstime: the CPU of its children that have ended and
            # been waited for (a run's ServerApp, gone by the time a round is read).
            seconds = sum(int(f) for f in fields[11:15]) / CLK_TCK
            cpu += seconds
            root += seconds if p == pid else 0.0
            rss += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
    return TreeSample(cpu, rss / 2**20, root)
