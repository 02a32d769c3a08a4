"""SIGTERM ends a `fedveil simulate` run and every process it started within seconds.

Seen before: after SIGTERM, two ~290 MB worker processes lived on for at least 37 s.
On a quiet machine all are gone in 1-2 s; the limit (LIMIT_S) leaves room for a 2-core
machine at load 20-45 (three test sessions side by side), where 5 s was once exceeded by
an interpreter's exit alone, and stays well below the 37 s of the old leak.
The run is a real subprocess; its descendants are read from /proc (Linux only), each
with its start time (tests/proctree.py), so that a later process reusing a pid is not one.
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
from proctree import alive, descendants

LIMIT_S = 20.0

pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]


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
        kids: dict[int, int] = {}  # pid -> start time: a reused pid is not taken for one
        while time.monotonic() < deadline and proc.poll() is None:
            kids = {k: t for k, t in descendants(proc.pid).items() if alive(k, t)}
            if len(kids) >= want_children and metrics.exists() and metrics.stat().st_size:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert len(kids) >= want_children, f"only {len(kids)} child processes appeared"
        time.sleep(1.0)  # let them get to work
        kids |= descendants(proc.pid)
        proc.send_signal(sig)
        start = time.monotonic()
        while time.monotonic() - start < LIMIT_S and (
            proc.poll() is None or any(alive(k, t) for k, t in kids.items())
        ):
            time.sleep(0.1)
        left = sorted(k for k, t in kids.items() if alive(k, t))
        took = time.monotonic() - start
        assert proc.poll() is not None, f"the run itself ignored signal {sig} for {took:.0f} s"
        assert not left, f"processes alive {took:.0f} s after signal {sig}: {left}"
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
