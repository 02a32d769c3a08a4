"""A disk that fills during a run: a JSONL record is written whole or not at all, a torn
last line (from a crash) is dropped on resume and said so, and the resumed run records
each round exactly once. The real thing: a 256 KiB tmpfs (needs root to mount)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedveil.config import load_config
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.simulate_run import simulate

ROUNDS = 20
PAGE = 4096  # tmpfs allocates by page: an append fails where it needs a new one


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` (a file the test removes to free them)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def tiny(out: Path):
    return load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "server.rounds": ROUNDS,
            "data.num_clients": 4,
            "server.per_round": 4,
            "eval.central_every": 0,
            "device": "cpu",
            "out": str(out),
        },
    )


@pytest.mark.procs
def test_a_disk_filled_during_a_run_loses_and_repeats_no_round(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = small_disk / "run"
    filled: list[Path] = []

    def fill_before_a_page_boundary(record) -> None:
        """After the round whose checkpoint is on disk, when the next metrics line will
        not fit in metrics.jsonl's last page: the disk fills, so that line is cut."""
        size = (out / "metrics.jsonl").stat().st_size
        if not filled and size % PAGE + 1.2 * size / record.round > PAGE:
            filled.append(fill(small_disk))

    with pytest.raises(OSError) as error:
        simulate(tiny(out), on_round=fill_before_a_page_boundary)
    assert filled, "the run never came near a page boundary"
    assert error.value.errno == errno.ENOSPC
    text = (out / "metrics.jsonl").read_bytes()
    # Whole or not at all: the file ends with a complete line (the old append left a
    # partial line here, and every resume then failed with JSONDecodeError).
    assert text.endswith(b"\n"), text[-80:]
    written = [json.loads(line)["round"] for line in text.decode().splitlines()]
    assert written == list(range(1, len(written) + 1))

    filled[0].unlink()  # space freed
    caplog.set_level(logging.INFO)
    simulate(tiny(out), resume=True)
    rounds = [m["round"] for m in RunStore(out).read_metrics()]
    assert rounds == list(range(1, ROUNDS + 1))  # each round recorded exactly once


def test_a_torn_last_line_is_dropped_on_resume_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process killed mid-append leaves a partial last line: resume drops it, names it,
    and every complete record stays; a bad line before the last still refuses."""
    store = RunStore(tmp_path)
    for r in (1, 2, 3):
        store.append_metrics({"round": r, "accuracy": 0.5})
        store.append_private({"round": r, "cohort": [1, 2]})
    for path in (store.metrics_path, store.private_rounds_path):
        with path.open("ab") as f:
            f.write(b'{"round": 4, "accur')
    with caplog.at_level(logging.WARNING, logger="fedveil.run"):
        store.truncate_metrics(3)
        store.truncate_private(3)
    assert [m["round"] for m in store.read_metrics()] == [1, 2, 3]
    assert [m["round"] for m in store.read_private()] == [1, 2, 3]
    assert store.metrics_path.read_bytes().endswith(b"}\n")
    assert caplog.text.count("dropped a torn last line (19 bytes") == 2
    os.truncate(store.metrics_path, 5)  # line 1 cut, not the last line any more:
    with store.metrics_path.open("ab") as f:
        f.write(b'\n{"round": 2}\n')
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        store.read_metrics()
