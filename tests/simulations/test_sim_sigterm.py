"""SIGTERM ends a `fedveil simulate` run and every process it started within 5 s.

Seen before: after SIGTERM, two ~290 MB worker processes lived on for at least 37 s.
The run is a real subprocess; its descendants are read from /proc (Linux only).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(pid: int) -> set[int]:
    parents, found, frontier = _parents(), set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's wait is due


def _run_and_terminate(
    args: list[str], env: dict[str, str], want_children: int, sig: int = signal.SIGTERM
) -> None:
    """Start the run, wait for its first round and its child processes, then signal it."""
    metrics = Path(args[args.index("--out") + 1], "metrics.jsonl")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedveil.cli.main", "simulate", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the teardown can end the whole group, whatever happens
    )
    try:
        deadline = time.monotonic() + 120
        kids: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            kids = {k for k in descendants(proc.pid) if alive(k)}
            if len(kids) >= want_children and metrics.exists() and metrics.stat().st_size:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert len(kids) >= want_children, f"only {len(kids)} child processes appeared"
        time.sleep(1.0)  # let them get to work
        kids |= descendants(proc.pid)
        proc.send_signal(sig)
        start = time.monotonic()
        while time.monotonic() - start < 5 and (proc.poll() is None or any(alive(k) for k in kids)):
            time.sleep(0.1)
        left = sorted(k for k in kids if alive(k))
        assert proc.poll() is not None, f"the run itself ignored signal {sig} for 5 s"
        assert not left, f"processes alive 5 s after signal {sig}: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):  # its own session: pgid = pid
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# SIGKILL: the run gets no chance to close its pool; the workers notice on their own.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_ends_the_run_and_its_worker_processes(tmp_path, tiny_env, sig):
    args = [
        "--task", "tiny_task:make", "--clients", "12", "--per-round", "12",
        "--rounds", "100000", "--out", str(tmp_path / "run"),
        "--set", "simulation.workers=2", "--set", "simulation.plots=false", "--quiet",
    ]  # fmt: skip
    _run_and_terminate(args, tiny_env, want_children=2, sig=sig)


@pytest.mark.flower
@pytest.mark.slow
def test_sigterm_ends_a_flower_run_and_its_ray_processes(tmp_path, tiny_env):
    args = [
        "--task", "tiny_task:make", "--clients", "4", "--per-round", "4",
        "--rounds", "100000", "--out", str(tmp_path / "run"), "--transport", "flower",
        "--set", "simulation.plots=false", "--quiet",
    ]  # fmt: skip
    env = {**tiny_env, "RAY_ADDRESS": ""}
    _run_and_terminate(args, env, want_children=4)
