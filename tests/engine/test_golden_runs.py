"""Golden runs: small fixed-seed runs whose model and records must not change when the
engine is refactored (issue 32: one engine, schedulers and release mechanisms).

Each scenario is a `fedveil simulate` run of the tiny task on the simulated clock, with
one worker (in-process), one torch thread and a fixed vmap width. Without DP the
fixture holds the model's tensors (sha256 of their exact bytes, a few values) and
metrics.jsonl without its timing fields: equal bit for bit. Central and distributed DP
noise comes from the OS CSPRNG, so a DP run's model differs from run to run: there
the fixture holds the ledger's records without timestamps, run ids, hashes and
signatures (cohorts seeded, no adaptive clipping), and the metrics that do not depend
on the noise. Secure aggregation's stochastic rounding draws its bits from the OS
CSPRNG too: a secure-aggregation run without DP is compared exactly in everything but
its floats (the model's values, test loss and accuracy). Two runs at the same commit
differ there by about one quantization step (2 r / (L - 1) = 1.9e-6 at the defaults), so
these agree within rtol 1e-5 and SECAGG_STEPS steps; its train loss (a masked sum
rounded at random on a coarse grid) is left out.

The fixtures (tests/engine/golden/*.json) were written at the commit that added this
test, before the engine was touched; regenerate only on purpose:
    .venv/bin/python tests/engine/test_golden_runs.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate

GOLDEN = Path(__file__).parent / "golden"

BASE: dict[str, Any] = {
    "model.task": "tiny_task:make",
    "data.num_clients": 12,
    "server.per_round": 6,
    "server.rounds": 3,
    "simulation.workers": 1,
    "simulation.vmap_clients": 4,
    "simulation.plots": False,
    "seed": 7,
}
LATENCY = {"simulation.latency_median": 1.0, "simulation.latency_sigma": 1.0}
# A buffer of 3: with 2, a + b == b + a and a change of summation order would not show.
ASYNC = {"server.mode": "async", "server.buffer": 3, "server.concurrency": 6, **LATENCY}
SECAGG = {"secagg.enabled": True}
CENTRAL = {
    "dp.mechanism": "central",
    "dp.epsilon": 16.0,
    "dp.noise_multiplier": 2.0,
    "dp.clip": 0.5,
    "dp.seeded_cohorts": True,
}
DISTRIBUTED = {**CENTRAL, **SECAGG, "dp.mechanism": "distributed"}

SCENARIOS: dict[str, dict[str, Any]] = {
    "sync": {},
    "sync_secagg": SECAGG,
    "async": {**ASYNC, "server.rounds": 4},
    "async_secagg": {
        **ASYNC,
        **SECAGG,
        "server.concurrency": 6,
        "server.group_size": 3,
        "server.buffer": 3,
    },
    "ssp": {**ASYNC, "server.mode": "ssp", "server.ssp_bound": 1, "server.rounds": 4},
    "dp_central_sync": CENTRAL,
    "dp_central_async": {**ASYNC, **CENTRAL, "server.max_participations": 2},
    "dp_distributed_sync": DISTRIBUTED,
    "dp_distributed_async": {
        **ASYNC,
        **DISTRIBUTED,
        "server.concurrency": 6,
        "server.group_size": 3,
        "server.buffer": 3,
        "server.max_participations": 2,
    },
}

# Secure aggregation: how many quantization steps (clip_range 1, 2^20 levels) two runs'
# floats may differ by; about one was measured between two runs at the same commit.
SECAGG_STEPS = 8
SECAGG_ATOL = SECAGG_STEPS * 2.0 / (2**20 - 1)
# Wall-clock figures: they differ on every run.
TIMING_KEYS = {"duration_s", "wall_s", "timestamp", "time", "started", "ended"}
# A ledger record's fields that name the run, the time or the chain, not the release.
LEDGER_VOLATILE = {
    "timestamp",
    "time",
    "created",
    "run_id",
    "hash",
    "prev_hash",
    "previous_hash",
    "signature",
    "public_key",
    "key_id",
    "head",
    "ledger_head",
    "opening",
    # The closing record's hash of the model file: under DP the model moves with the noise.
    "model_sha256",
}
# Under DP the noise (OS CSPRNG) moves the model: metrics that depend on it are left out.
NOISY_METRICS = {
    "train_loss",
    "test_loss",
    "test_accuracy",
    "federated_loss",
    "federated_accuracy",
    "update_norm",
    "clip",
}


@pytest.fixture
def one_thread() -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def produce(name: str, out: Path) -> dict[str, Any]:
    """Run scenario `name` into `out`; what the golden fixture compares."""
    values = {**BASE, **SCENARIOS[name], "out": str(out)}
    cfg = load_config(None, values)
    simulate(cfg)
    dp = cfg.dp.mechanism != "none"
    result: dict[str, Any] = {"config": SCENARIOS[name]}
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    drop = TIMING_KEYS | (NOISY_METRICS if dp else set())
    if cfg.secagg.enabled:  # the loss rides masked, rounded at random to a coarse grid
        drop = drop | {"train_loss"}
    result["metrics"] = [_strip(m, drop) for m in metrics]
    if dp:
        result["ledger"] = _ledger(out)
    else:
        result["model"] = _model_digest(out / "model.safetensors", values=cfg.secagg.enabled)
    return result


def _strip(value: Any, drop: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, drop) for k, v in sorted(value.items()) if k not in drop}
    if isinstance(value, list):
        return [_strip(v, drop) for v in value]
    return value


def _model_digest(path: Path, *, values: bool) -> dict[str, Any]:
    """sha256 of the tensors' exact bytes and their first values; `values`: every value
    instead of the digest (a run whose bits are not reproducible: secure aggregation)."""
    tensors = load_file(str(path))
    digest = hashlib.sha256()
    shown: dict[str, list[float]] = {}
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        digest.update(key.encode() + b"\0" + t.numpy().tobytes())
        shown[key] = [float(x) for x in t.flatten()[: None if values else 3]]
    if values:
        return {"values": shown}
    return {"sha256": digest.hexdigest(), "first_values": shown}


def _assert_close(got: Any, expected: Any, where: str = "") -> None:
    """Equal, but floats within SECAGG_STEPS quantization steps (secure aggregation)."""
    if isinstance(expected, float) and isinstance(got, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=SECAGG_ATOL), where
    elif isinstance(expected, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(expected), where
        for key in expected:
            _assert_close(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list) and isinstance(got, list):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _assert_close(g, e, f"{where}[{i}]")
    else:
        assert got == expected, where


def _ledger(out: Path) -> list[dict[str, Any]]:
    paths = sorted(out.rglob("ledger*.jsonl"))
    assert paths, f"no ledger under {out}"
    records: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            records.append(_strip(json.loads(line), LEDGER_VOLATILE))
    return records


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_golden_run_reproduces_bit_for_bit(name, tmp_path, one_thread):
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    got = json.loads(json.dumps(produce(name, tmp_path / "run")))  # the fixture's types
    assert got["config"] == expected["config"]
    assert got.get("ledger") == expected.get("ledger")
    if "values" in expected.get("model", {}):  # secure aggregation without DP
        _assert_close(got["metrics"], expected["metrics"], "metrics")
        _assert_close(got["model"], expected["model"], "model")
        return
    assert got["metrics"] == expected["metrics"]
    assert got.get("model") == expected.get("model")


def _write(names: list[str]) -> None:
    import tempfile

    torch.set_num_threads(1)
    GOLDEN.mkdir(exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            result = produce(name, Path(tmp) / "run")
        (GOLDEN / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print("wrote", name)


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: test_golden_runs.py --write [scenario ...]")
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tiny_task
    sys.path.insert(1, str(Path(__file__).parents[2]))
    chosen = [a for a in sys.argv[1:] if a != "--write"] or sorted(SCENARIOS)
    _write(chosen)
