"""A process's descendants and their listening sockets, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, ...], or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def descendants(root: int) -> dict[int, int]:
    """pid -> start time (clock ticks since boot) of every live process below `root`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        starts[int(entry.name)] = int(fields[19])
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = starts[pid]
        todo += children.get(pid, [])
    return out


def start_time(pid: int) -> int | None:
    """When the process `pid` started (clock ticks since boot), None if there is none: with
    `alive`, it tells that process from a later one that got the same pid (pids wrap at
    kernel.pid_max, 32768 here, and a busy machine goes through them)."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def alive(pid: int, start: int) -> bool:
    """The same process (not a reused pid) still runs (a zombie counts as gone)."""
    fields = _stat(pid)
    return fields is not None and int(fields[19]) == start and fields[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def listening_tcp_ports(pids: list[int]) -> set[int]:
    """TCP ports (IPv4 and IPv6) on which one of `pids` listens."""
    inodes = socket_inodes(pids)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[9]) in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def listening_unix_paths(pids: list[int]) -> set[str]:
    """Paths of the Unix sockets on which one of `pids` listens."""
    inodes = socket_inodes(pids)
    paths = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        # Flags 00010000: __SO_ACCEPTCON, a listening socket.
        if len(cols) >= 8 and int(cols[6]) in inodes and cols[3] == "00010000":
            paths.add(cols[7])
    return paths
