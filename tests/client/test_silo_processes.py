"""Secure all-reduce among 4 silo processes on loopback with gloo (issue 34).

Each silo is a real process (tests/client/silo_worker.py) on a real TCP store and gloo
process group; updates are known to the test, so it checks the sums exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from loopback_ports import free_port
from silo_checks import leaked_partial_sums
from silo_worker import quantizer, silo_update

pytestmark = pytest.mark.procs
WORLD = 4
WORKER = Path(__file__).with_name("silo_worker.py")


def _start(tmp_path: Path, collective: str, dying: int | None = None) -> list[subprocess.Popen]:
    port, secret = free_port(), os.urandom(32).hex()
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent), "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(WORLD):
        argv = [sys.executable, str(WORKER), str(rank), str(WORLD), str(port), secret]
        argv += [str(tmp_path), collective] + (["die"] if rank == dying else [])
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs: list[subprocess.Popen], ranks: list[int]) -> None:
    errors = {}
    try:
        for rank in ranks:
            _, errors[rank] = procs[rank].communicate(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank in ranks:
        assert procs[rank].returncode == 0, f"silo {rank}: {errors[rank][-3000:]}"


def _load(tmp_path: Path, rank: int) -> dict:
    with np.load(tmp_path / f"silo-{rank}.npz") as data:
        return {k: data[k] for k in data.files}


def test_four_silo_processes_sum_exactly_and_every_ring_chunk_received_is_masked(tmp_path):
    procs = _start(tmp_path, "ring")
    _finish(procs, list(range(WORLD)))
    silos = [_load(tmp_path, r) for r in range(WORLD)]
    q = quantizer(WORLD)
    encoded = {r: s["encoded"] for r, s in enumerate(silos)}
    exact = sum(v.astype(np.int64) for v in encoded.values()) % (1 << q.bits)
    plain = sum(silo_update(r).astype(np.float64) for r in range(WORLD))
    for s in silos:
        assert list(s["members"]) == [0, 1, 2, 3] and int(s["attempt"]) == 0
        # The masks cancel: the secure sum is the exact integer sum of the encodings ...
        assert np.array_equal(s["total"].astype(np.int64), exact)
        # ... and decodes to the plain all-reduce's sum within the quantisation bound.
        mean, weight, count = q.decode_weighted_mean(s["total"])
        assert (weight, count) == (WORLD, WORLD)
        secure = mean[: plain.size] * WORLD
        assert np.max(np.abs(secure - plain)) <= WORLD * q.step
        assert np.allclose(s["plain"], plain, atol=1e-5)
        chunks = [
            (int(i), s[f"chunk{n}"])
            for n, (phase, i) in enumerate(zip(s["phases"], s["indices"], strict=True))
            if phase == "reduce_scatter"
        ]
        assert len(chunks) == WORLD - 1
        assert leaked_partial_sums(chunks, encoded, q.bits) == []


def test_a_silo_killed_mid_collective_aborts_the_attempt_and_survivors_rerun_with_fresh_masks(
    tmp_path,
):
    procs = _start(tmp_path, "ring", dying=3)
    flag = tmp_path / "silo-3.dying"
    deadline = time.monotonic() + 120
    while not flag.exists():  # silo 3 has received its first chunk of the ring
        assert time.monotonic() < deadline and procs[3].poll() is None, procs[3].stderr.read()
        time.sleep(0.05)
    procs[3].send_signal(signal.SIGKILL)
    procs[3].wait()
    _finish(procs, [0, 1, 2])
    q = quantizer(WORLD)
    survivors = [_load(tmp_path, r) for r in range(3)]
    encoded = {r: s["encoded"] for r, s in enumerate(survivors)}
    exact = sum(v.astype(np.int64) for v in encoded.values()) % (1 << q.bits)
    for s in survivors:
        assert list(s["members"]) == [0, 1, 2]
        assert int(s["attempt"]) == 1 and int(s["aborted"]) == 1
        # Exactly the survivors' sum: nothing of the aborted attempt was added in.
        assert np.array_equal(s["total"].astype(np.int64), exact)
        _mean, weight, count = q.decode_weighted_mean(s["total"])
        assert (weight, count) == (3, 3)
        # Fresh masks: what the rerun delivered differs from the aborted attempt's chunks,
        # and no chunk of either attempt is an unmasked partial sum.
        first = [s[f"chunk{n}"] for n, a in enumerate(s["attempts"]) if a == 0]
        rerun = [
            (int(i), s[f"chunk{n}"])
            for n, (a, phase, i) in enumerate(
                zip(s["attempts"], s["phases"], s["indices"], strict=True)
            )
            if a == 1 and phase == "reduce_scatter"
        ]
        assert len(rerun) == 2
        assert leaked_partial_sums(rerun, encoded, q.bits) == []
        assert not any(np.array_equal(f, c) for f in first for _, c in rerun)
