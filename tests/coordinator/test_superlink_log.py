"""The SuperLink's captured output cannot fill the disk (issue 31): rotated at a size,
repeated lines collapsed. A real child process writes through the same pump the
coordinator uses for its SuperLink."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedveil.ops.log_pump import LogPump, RotatingLog

pytestmark = pytest.mark.procs  # starts processes (make test-fast leaves it out)

# What an idle SuperLink and a garbage-request flood print: one shape, new numbers.
NOISE = (
    "import sys\n"
    "for i in range(20000):\n"
    "    print(f'2026-11-28 10:00:{i % 60:02d} INFO ListRuns request {i} from 127.0.0.1:{i}')\n"
    "print('the last distinct line')\n"
)


def _pump(tmp_path, code: str, **limits: int) -> RotatingLog:
    log = RotatingLog(tmp_path / "superlink.log", **limits)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    pump = LogPump(proc.stdout, log)
    proc.wait(60)
    pump.join(30)
    return log


def test_a_flood_of_one_line_shape_is_collapsed(tmp_path):
    # Used to append every line: ~130 bytes per garbage request, a line a second idle.
    _pump(tmp_path, NOISE, burst=5)
    lines = (tmp_path / "superlink.log").read_text().splitlines()
    kept = [line for line in lines if line.startswith("2026-11-28")]
    assert len(kept) == 5
    assert lines[-2] == "the last distinct line"
    assert "19995 more lines like" in lines[-1] and "ListRuns request #" in lines[-1]


def test_the_log_rotates_at_its_size_and_keeps_its_backups(tmp_path):
    distinct = "for i in range(3000):\n    print('line ' + 'x' * (i % 50) + chr(65 + i % 26) * 8)\n"
    _pump(tmp_path, distinct, max_bytes=4096, backups=3, burst=10**6)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["superlink.log", "superlink.log.1", "superlink.log.2", "superlink.log.3"]
    for name in names:
        assert (tmp_path / name).stat().st_size <= 4096, name
