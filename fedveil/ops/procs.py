"""Child processes of `fedveil server` and `fedveil client` (Flower's SuperLink / SuperNode).

Shared by both entry points, stdlib only:
- Flower's commands run with *this* interpreter, so a SuperLink started from a
  virtualenv serves the fedveil installed in it, wherever PATH points;
- the children die with their parent, even on SIGKILL (Linux PR_SET_PDEATHSIG),
  so a killed coordinator never leaves a SuperLink holding its port and state;
  each generation below does the same for its own children (die_with_parent:
  the SuperExec shim, and the ServerApps it starts), so SIGKILL travels down the
  whole tree at once;
- Flower's own helpers (flower-superexec, flwr-serverapp) are found on PATH by
  the SuperLink, so this interpreter's bin directory goes first on it;
- a child that binds a port tells its parent which one through a file
  (report_port / await_reported_port): the parent never talks to a port it only
  picked, which another process may have taken before the child bound it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

# Console scripts of flwr 1.41, as `module:function`. The SuperNode is Flower's with its
# push step fixed: client/supernode.py.
FLWR_ENTRY_POINTS = {
    "flower-superlink": "flwr.superlink.cli:flower_superlink",
    "flower-supernode": "fedveil.client.edge.supernode:main",
    "flower-superexec": "flwr.supercore.cli:flower_superexec",
}


def flwr_command(name: str, args: Sequence[str]) -> list[str]:
    """argv that runs Flower's `name` command in this interpreter."""
    module, func = FLWR_ENTRY_POINTS[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; sys.exit({func}())"
    return [sys.executable, "-c", code, *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    # Flower's update check would try the network at every start.
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.update(extra or {})
    return env


PR_SET_PDEATHSIG = 1
# Loaded here, not in a forked child: dlopen after fork in a threaded parent can deadlock.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when `parent` dies (Linux prctl).

    Call it in the child, first thing (or as preexec_fn), with the pid of the process
    that started it. If `parent` is already gone (it died before the request), this
    process takes `sig` at once. The signal follows the parent *thread* that forked
    the child: start children that must outlive a thread from the main thread.
    Elsewhere a no-op: children outlive a SIGKILLed parent there; SIGTERM still stops
    them through their process group.
    """
    if _LIBC is None:
        return
    _LIBC.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def _child_setup(parent: int) -> None:  # pragma: no cover - runs in the child
    die_with_parent(parent)
    os.setpgid(0, 0)  # own process group: signals to it reach Flower's helpers too


def spawn(
    argv: list[str],
    *,
    env: dict[str, str],
    log: IO[bytes] | int | None,
    cwd: Path | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Start a child that dies with this process (see module doc). `log`: a file for its
    output, subprocess.PIPE to read it (fedveil.ops.log_pump), or None to discard it;
    `pass_fds`: descriptors the child inherits (a listening socket)."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        pass_fds=pass_fds,
        stdin=subprocess.DEVNULL,
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=functools.partial(_child_setup, os.getpid()) if os.name == "posix" else None,
    )


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    """SIGTERM the child's process group, then SIGKILL what is left after `timeout`."""
    if proc.poll() is not None:
        _kill_group(proc.pid, signal.SIGKILL)  # stragglers of an exited leader
        return proc.returncode
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait(5)
    _kill_group(proc.pid, signal.SIGKILL)
    return proc.returncode


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None) -> bool:
    """True once something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def wait_unix_socket(path: Path, timeout: float, proc: subprocess.Popen[bytes] | None) -> bool:
    """True once something accepts connections on the Unix socket at `path`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.settimeout(0.5)
                sock.connect(str(path))
                return True
            except OSError:
                pass
        time.sleep(0.1)
    return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def report_port(path: Path, port: int) -> None:
    """In a child: write the port it listens on, so that a reader sees the whole number
    or no file (written aside, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def await_reported_port(
    path: Path,
    proc: subprocess.Popen[bytes],
    timeout: float,
    stopping: Callable[[], bool] = lambda: False,
) -> int | None:
    """In the parent: the port the child `proc` reported in `path` (report_port); None
    if it exited first, did not report within `timeout` seconds, or `stopping()`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping():
        exited = proc.poll() is not None  # before the look: a report written just before
        try:  # the exit still counts
            return int(path.read_text())
        except (FileNotFoundError, ValueError):
            if exited:
                return None
        time.sleep(0.05)
    return None
