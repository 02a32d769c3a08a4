"""The process guard (tests/procguard.py) as a run of pytest sees it: a fast-tier test that
starts a process fails and says to mark it; a marked one passes; a process left running fails
the session, and is killed; processes of a session killed hard are swept by the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proctree import alive, descendants

TESTS = Path(__file__).parent

pytestmark = pytest.mark.procs

GUARDED = """
import subprocess, sys, time
import pytest

def test_pure():
    assert sum(range(4)) == 6

def test_starts_a_process_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_spawns_through_multiprocessing_unmarked():
    import multiprocessing

    proc = multiprocessing.get_context("spawn").Process(target=sum, args=([1, 2],))
    proc.start()
    proc.join()

@pytest.mark.procs
def test_starts_a_process_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""

LEAKY = """
import subprocess, sys
import pytest

@pytest.mark.procs
def test_leaves_a_sleeper():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                     start_new_session=True)
"""


def _pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "procguard",
            "-p",
            "no:cacheprovider",
            "-q",
            "--procs-guard",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_a_fast_test_that_starts_a_process_fails_and_a_marked_one_passes(tmp_path):
    done = _pytest(tmp_path, GUARDED)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "4 passed, 2 errors" in done.stdout, done.stdout
    assert "ERROR test_sample.py::test_starts_a_process_unmarked" in done.stdout
    # multiprocessing's spawn raises no audit event: the reaped child's CPU time shows it.
    assert "ERROR test_sample.py::test_spawns_through_multiprocessing_unmarked" in done.stdout
    assert "children that ended used" in done.stdout
    assert "is in the fast tier but created a process (subprocess.Popen" in done.stdout
    assert "mark it @pytest.mark.procs" in done.stdout
    # The fast tier deselects the marked test, and the guard has nothing to say then.
    fast = _pytest(tmp_path, GUARDED, "-m", "not procs", "-k", "pure")
    assert fast.returncode == 0 and "1 passed, 3 deselected" in fast.stdout, fast.stdout


def test_a_process_left_running_fails_the_session_and_is_killed(tmp_path):
    done = _pytest(tmp_path, LEAKY)
    assert "1 passed" in done.stdout, done.stdout
    assert done.returncode == 1, done.stdout
    assert "procguard: FAILED: 1 process(es) still running after the last test" in done.stdout
    assert "time.sleep(300)" in done.stdout
    pid = int(done.stdout.split("after the last test (killed now): ")[1].split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (
        not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
    ), "the leftover still runs"


TIMED_OUT = """
import os, signal, subprocess, sys, time
import pytest

@pytest.fixture
def server():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(302)"],
                            start_new_session=True)
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

@pytest.mark.procs
@pytest.mark.timeout(3)
def test_hangs(server):
    time.sleep(120)
"""


def test_a_test_killed_at_its_timeout_still_tears_down_its_processes(tmp_path):
    started = time.monotonic()
    done = _pytest(tmp_path, TIMED_OUT, "-o", "timeout_method=signal")
    assert time.monotonic() - started < 60, "the timeout did not stop the test"
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout
    assert "Timeout (>3.0s) from pytest-timeout" in done.stdout, done.stdout
    # The fixture's teardown ran: nothing left for the session-end check.
    assert "procguard: FAILED" not in done.stdout, done.stdout


def test_the_next_session_sweeps_what_a_session_killed_hard_left(tmp_path):
    # A session killed with SIGKILL runs no teardown and no session-end check: its sleeper
    # (in its own session, as the harness starts servers) outlives it.
    (tmp_path / "test_sample.py").write_text(LEAKY.replace("300", "301"))
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    killed = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "procguard",
            "-p",
            "no:cacheprovider",
            "-q",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path),
            "-s",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    sleepers: dict[int, int] = {}
    while not sleepers and time.monotonic() < deadline:
        sleepers = {
            pid: start
            for pid, start in descendants(killed.pid).items()
            if b"time.sleep(301)" in Path(f"/proc/{pid}/cmdline").read_bytes()
        }
        time.sleep(0.05)
    assert sleepers, "the inner session never started its sleeper"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    ((pid, start),) = sleepers.items()
    assert alive(pid, start), "nothing to sweep: the sleeper died with the session"
    try:
        (tmp_path / "next").mkdir()
        done = _pytest(tmp_path / "next", "def test_nothing():\n    pass\n")
        assert "process(es) left by a test session killed hard" in done.stdout
        assert "time.sleep(301)" in done.stdout
        deadline = time.monotonic() + 10
        while alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid, start)
    finally:
        if alive(pid, start):
            os.kill(pid, signal.SIGKILL)
