"""Loopback ports for servers a test starts, that no other process on the machine takes.

Contract: `free_port()` returns a TCP port on 127.0.0.1 that nothing listens on now and
that no other caller of `free_port()` gets while this process lives, in this or in any
concurrent test session (CI runs three sessions side by side, and other checkouts run
theirs). The caller hands it to the process it starts, which binds it later.

Why not bind(0) and close: a port the kernel picked that way sits in the ephemeral range
(net.ipv4.ip_local_port_range), where the kernel also picks the next bind(0) of any
process and the source port of every outgoing connection (Ray, gRPC and httpx open
thousands). Between the pick and the server's bind another process could take it, and
the server would fail to start. So the ports come from a range the kernel never hands
out by itself (below the ephemeral range, above Ray's worker ports 10002-19999 and the
fixed defaults of Flower, fedveil and Ray), drawn at random, and are reserved for this
process's life by an exclusive flock on a file per port in a shared directory: another
session skips a port whose lock it cannot take. The lock goes with the process, however
it ends, so a killed session leaves no reservation behind. On a kernel whose ephemeral
range covers the tests' range, the ports are the kernel's picks, still reserved.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOW, HIGH = 20_000, 32_000  # [LOW, HIGH): no kernel-chosen port falls here (checked below)
_LOCKS = Path(tempfile.gettempdir()) / "fedveil-test-ports"
_held: dict[int, int] = {}  # port -> the descriptor holding its lock, for this process's life


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def outside_ephemeral_range() -> bool:
    """The tests' range [LOW, HIGH) lies outside the kernel's ephemeral ports (Linux's
    default 32768-60999 does)."""
    low, high = _ephemeral_range()
    return low >= HIGH or high < LOW


def _reserve(port: int) -> bool:
    """Take this port's lock for this process's life; False if another process holds it."""
    try:
        _LOCKS.mkdir(mode=0o777, exist_ok=True)
        fd = os.open(_LOCKS / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return True  # no shared directory to coordinate through: the bind check still holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held[port] = fd
    return True


def _bindable(port: int) -> bool:
    """Nothing is bound to the port now (on loopback or on every address)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_pick() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A loopback TCP port reserved for this process (see the module's contract). Where the
    kernel's ephemeral range covers the tests' range (not Linux's default), the port is
    the kernel's pick, still reserved against the other sessions."""
    outside = outside_ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(LOW, HIGH) if outside else _kernel_pick()
        if port in _held or not _reserve(port):
            continue
        if _bindable(port):
            return port
        with contextlib.suppress(OSError):  # in use by a process outside the scheme
            os.close(_held.pop(port))
    raise RuntimeError(f"no free loopback port in {LOW}-{HIGH - 1} after 1000 draws")
