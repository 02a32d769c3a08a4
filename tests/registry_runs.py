"""Two tiny finished runs (one under central DP, one without) for the registry's tests."""

from __future__ import annotations

from pathlib import Path

from fedveil.config import load_config
from fedveil.simulations.run import simulate


def tiny_run(out: Path, *, dp: bool, rounds: int = 2) -> Path:
    """A finished tiny_task run in `out`, as `fedveil simulate` writes it."""
    overrides: dict[str, object] = {
        "model.task": "tiny_task:make",
        "data.num_clients": 6,
        "server.per_round": 3,
        "server.rounds": rounds,
        "simulation.workers": 1,
        "out": str(out),
    }
    if dp:
        overrides.update({"dp.mechanism": "central", "dp.epsilon": 8.0})
    simulate(load_config(None, overrides))
    return out
