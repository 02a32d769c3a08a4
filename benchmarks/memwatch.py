"""Peak memory of a process tree (Linux /proc): a benchmark's process and all its descendants.

RSS summed over the tree counts pages shared between processes (libraries,
forked copy-on-write data) once per process, which overstates what forked
workers cost; PSS splits shared pages between their users and sums to the
real footprint. RSS is cheap to read and sampled every interval for the peak;
PSS costs tens of milliseconds per big process (the kernel walks its page
tables), so the benchmark's children read it once, at the end of their last
round, when a run's memory is at its steady state (RoundClock).
"""

from __future__ import annotations

import itertools
import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def descendants(root: int) -> list[int]:
    """`root` and every live process below it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start past the last ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


class PeakWatcher:
    """Samples a process tree's RSS in a background thread; keeps the peak."""

    def __init__(self, root: int, interval_s: float = 0.1) -> None:
        self.root, self.interval_s = root, interval_s
        self.peak_rss = self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> None:
        pids = descendants(self.root)
        self.peak_rss = max(self.peak_rss, sum(map(rss_bytes, pids)))
        self.max_processes = max(self.max_processes, len(pids))

    def __enter__(self) -> PeakWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_seconds(root: int) -> float:
    """CPU time used by `root` and its live descendants (Ray's workers, our workers)."""
    return sum(map(cpu_seconds, descendants(root)))


class RoundClock:
    """Round boundaries in wall time and in CPU time of this process tree.

    CPU time per round is what a round costs whatever else loads the machine;
    wall time is what a user waits.
    """

    def __init__(self) -> None:
        self.at: list[float] = []
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def mark(self) -> None:
        self.at.append(time.time())
        self.wall.append(time.perf_counter())
        self.cpu.append(tree_cpu_seconds(os.getpid()))

    def result(self) -> dict[str, object]:
        """Per-round wall and CPU time; the tree's PSS now (call after the last round)."""
        pids = descendants(os.getpid())
        return {
            "end_pss_mb": sum(map(pss_bytes, pids)) / (1 << 20),
            "round_s": [b - a for a, b in itertools.pairwise(self.wall)],
            "round_cpu_s": [b - a for a, b in itertools.pairwise(self.cpu)],
            "first_round_at": self.at[0],
        }


class ProcessPeak:
    """This process's own peak RSS over a block (Linux VmHWM, reset at the start by writing
    5 to /proc/self/clear_refs): exact, with no sampling, and without child processes
    (Ray's workers, our worker pool): in a benchmark of the server that is the server.
    `peak_mb` is None where /proc does not allow the reset."""

    def __init__(self) -> None:
        self.peak_mb: float | None = None
        self._reset = False

    def __enter__(self) -> ProcessPeak:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._reset = True
        except OSError:
            self._reset = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self._reset:
            self.peak_mb = _status_kb("VmHWM") / 1024


def _status_kb(field: str) -> int:
    """A `kB` field of /proc/self/status (0 if missing)."""
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(field.encode() + b":"):
                return int(line.split()[1])
    return 0
