"""Randomness hygiene and the benchmark entry points (smoke-sized)."""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np
import pytest
from secagg_helpers import make_session

from fedveil.benchmarks import bench_secagg
from fedveil.privacy.secagg import SecAggClient, randomness

SOURCES = pathlib.Path(randomness.__file__).parent


@pytest.mark.real_randomness
def test_production_randomness_is_the_os_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.urandom

    def spy(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", spy)
    session = make_session(4)
    a = SecAggClient(session.client_ids[0], session).advertise()
    b = SecAggClient(session.client_ids[1], session).advertise()
    assert calls and a.mask_public_key != b.mask_public_key
    assert 0 <= randomness.random_below(10) < 10


def test_protocol_code_uses_no_other_random_source() -> None:
    forbidden = re.compile(r"^\s*(import|from) (random|secrets)\b|np\.random|numpy\.random", re.M)
    # in_memory.py only picks which simulated clients drop out; it makes no protocol secrets.
    allowed = {"randomness.py", "in_memory.py"}
    offenders = [
        path.name
        for path in SOURCES.glob("*.py")
        if path.name not in allowed and forbidden.search(path.read_text())
    ]
    assert offenders == []


def test_bench_protocol_smoke() -> None:
    out = bench_secagg.bench_protocol(n=8, dim=64, dropout=0.25, seed=1)
    assert out["sum_exact"] and out["mean_close"]
    assert out["survivors"] == 6
    assert out["client_stage_median_s"]["masked_input"] > 0
    assert out["bytes_up_per_client_median"] > 64 * 4
    assert out["prg_lower_bound_s"] > 0


@pytest.mark.procs
def test_bench_flower_smoke() -> None:
    pytest.importorskip("flwr")
    out = bench_secagg.compare(n=6, dim=32, dropout=0.2, seed=2)
    assert out["flower"]["mean_close"] and out["fedveil"]["mean_close"]
    assert out["compute_ratio"] > 0 and np.isfinite(out["critical_path_ratio"])
