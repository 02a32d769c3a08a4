"""The suite's process discipline: no test leaves a process behind, and no fast test starts one.

- Every process the suite starts inherits FEDVEIL_TEST_SESSION = "<pytest pid>:<its start
  time>". At session start, processes that carry the marker of a session whose pytest is gone
  (a run killed hard, where no teardown ran) are killed: `sweep_dead_sessions`. Concurrent
  sessions of other checkouts are alive and left alone.
- At session end, a process still running below pytest, or carrying this session's marker, is
  a leak: `leftovers` names it, the run is failed and the process killed.
- Tests that start no process form the fast tier (`make test-fast`). Under --procs-guard
  (make test and make test-fast pass it), a test not marked `procs` (or `flower`) that
  creates a child process, through Python (audit events of fork / spawn / subprocess), or
  that has a child left at teardown, or whose reaped children used CPU time, fails at
  teardown, naming how: mark it `@pytest.mark.procs` so that it runs only in the full tier.
Linux (/proc); elsewhere the checks find nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from proctree import alive, cmdline, descendants

SESSION_ENV = "FEDVEIL_TEST_SESSION"
PROCESS_MARKS = ("procs", "flower")

# Python's own helpers that live as long as the interpreter and go with it: not a test's leak.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
# Audit events (PEP 578) by which Python code creates a process.
_SPAWN_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen"}
)


def _start_time(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def session_marker() -> str:
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def _marker_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # another user's process, or gone
        return None
    for entry in env.split(b"\0"):
        if entry.startswith(SESSION_ENV.encode() + b"="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


def _session_alive(marker: str) -> bool:
    pid, _, start = marker.partition(":")
    try:
        return _start_time(int(pid)) == int(start)
    except ValueError:
        return True  # not a marker we wrote: leave its process alone


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def sweep_dead_sessions() -> list[str]:
    """Kill the processes left by test sessions that are gone; their command lines."""
    swept = []
    me = os.getpid()
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        marker = _marker_of(pid)
        if pid == me or marker is None or _session_alive(marker):
            continue
        swept.append(f"{pid} {cmdline(pid)[:200]}")
        _kill(pid)
    return swept


def _helper(pid: int) -> bool:
    return any(name in cmdline(pid) for name in _INTERPRETER_HELPERS)


def leftovers(marker: str, grace_s: float = 10.0) -> list[str]:
    """Processes this session started that still run after `grace_s`: killed, and named."""
    deadline = time.monotonic() + grace_s
    while True:
        running = {
            pid: start for pid, start in session_processes(marker).items() if not _helper(pid)
        }
        if not running or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    named = [f"{pid} {cmdline(pid)[:200]}" for pid in sorted(running)]
    for pid in running:
        _kill(pid)
    return named


def session_processes(marker: str) -> dict[int, int]:
    """pid -> start time of the live processes below this one or carrying `marker`."""
    me = os.getpid()
    found = dict(descendants(me))
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid != me and pid not in found and _marker_of(pid) == marker:
            start = _start_time(pid)
            if start is not None:
                found[pid] = start
    return {pid: start for pid, start in found.items() if alive(pid, start)}


def end_processes(match: str, grace_s: float = 10.0) -> list[str]:
    """End this session's processes whose command line contains `match`: SIGTERM, then
    SIGKILL after `grace_s`. For a session resource's owner (a fixture) whose library
    leaves some of its processes to exit late. Returns their command lines."""
    targets = {
        pid: start
        for pid, start in session_processes(os.environ.get(SESSION_ENV, "")).items()
        if match in cmdline(pid)
    }
    named = [f"{pid} {cmdline(pid)[:120]}" for pid in sorted(targets)]
    for pid in targets:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(p, s) for p, s in targets.items()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, start in targets.items():
        if alive(pid, start):
            _kill(pid)
    return named


def live_children() -> set[int]:
    """Direct children of this process now (zombies included: they were started)."""
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            out.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return out


class SpawnWatch:
    """Records process creation by Python code while armed (one audit hook per interpreter)."""

    def __init__(self) -> None:
        self.armed = False
        self.seen: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if self.armed and event in _SPAWN_EVENTS:
            what = ""
            if event == "subprocess.Popen" and len(args) > 1:
                what = " " + " ".join(map(str, args[1] or []))[:160]
            self.seen.append(event + what)

    def arm(self) -> None:
        self.seen = []
        self.armed = True

    def disarm(self) -> list[str]:
        self.armed = False
        return self.seen


# -- the pytest plugin (tests/conftest.py loads it; `-p procguard` elsewhere) ------------------
_marker = ""
_watch: SpawnWatch | None = None
_swept: list[str] = []
_leaked: list[str] = []


def _starts_processes(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in PROCESS_MARKS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--procs-guard",
        action="store_true",
        help="fail a test not marked procs/flower that creates a process (make test-fast)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _marker, _watch
    config.addinivalue_line(
        "markers", "procs: starts a process (subprocess, deployment, workers): not in test-fast"
    )
    _swept[:] = sweep_dead_sessions()
    _marker = session_marker()
    os.environ[SESSION_ENV] = _marker
    if config.getoption("procs_guard"):
        _watch = SpawnWatch()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # type: ignore[no-untyped-def]
    if _watch is not None and not _starts_processes(item):
        item.stash[_children_key] = live_children()
        item.stash[_child_cpu_key] = _children_cpu()
        _watch.arm()
    return (yield)


_children_key = pytest.StashKey[set[int]]()
_child_cpu_key = pytest.StashKey[float]()


def _children_cpu() -> float:
    """CPU seconds of this process's children that have been waited for: it grows when a
    child started and ended within a test (multiprocessing's spawn raises no audit event)."""
    t = os.times()
    return t.children_user + t.children_system


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    result = yield
    before = item.stash.get(_children_key, None)
    if _watch is None or before is None:
        return result
    spawned = _watch.disarm()
    started = live_children() - before
    cpu = _children_cpu() - item.stash[_child_cpu_key]
    if spawned or started or cpu > 0:
        how = "; ".join(
            spawned[:5]
            + [f"child pid {p}: {cmdline(p)[:120]}" for p in started]
            + ([f"children that ended used {cpu:.2f} s of CPU"] if cpu > 0 else [])
        )
        pytest.fail(
            f"{item.nodeid} is in the fast tier but created a process ({how}): "
            "mark it @pytest.mark.procs",
            pytrace=False,
        )
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _marker:
        return
    _leaked[:] = leftovers(_marker)
    if _leaked and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _swept:
        terminalreporter.write_line(
            f"procguard: killed {len(_swept)} process(es) left by a test session killed hard: "
            + "; ".join(_swept[:10])
        )
    if _leaked:
        terminalreporter.write_line(
            f"procguard: FAILED: {len(_leaked)} process(es) still running after the last test "
            "(killed now): " + "; ".join(_leaked[:10]),
            red=True,
        )
