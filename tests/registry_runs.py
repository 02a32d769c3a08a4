"""Two tiny finished runs (one under central DP, one without) for the registry's tests."""

from __future__ import annotations

from pathlib import Path

from fedveil.config import load_config
from fedveil.simulations.simulate_run import simulate


def tiny_run(
    out: Path,
    *,
    dp: bool,
    rounds: int = 2,
    distributed: bool = False,
    init_model: Path | None = None,
    init_ref: str | None = None,
) -> Path:
    """A finished tiny_task run in `out`, as `fedveil simulate` writes it (`distributed`:
    distributed DP under secure aggregation, 8 of 12 clients a round)."""
    overrides: dict[str, object] = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12 if distributed else 6,
        "server.per_round": 8 if distributed else 3,
        "server.rounds": rounds,
        "simulation.workers": 1,
        "out": str(out),
    }
    if dp:
        overrides.update({"dp.mechanism": "central", "dp.epsilon": 8.0})
    if distributed:
        overrides.update({"dp.mechanism": "distributed", "dp.epsilon": 8.0, "secagg.enabled": True})
    simulate(load_config(None, overrides), init_model=init_model, init_ref=init_ref)
    return out
