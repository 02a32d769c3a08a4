"""gossip.momentum: quasi-global momentum (QG-DSGDm) in the gossip engine."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from fedveil.config import ConfigError, RunConfig, load_config
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.simulations.gossip.engine import GossipEngine
from fedveil.simulations.gossip.mixing import average
from fedveil.tasks import make_task


def _cfg(tmp_path: Path, **extra: object) -> RunConfig:
    return load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.aggregation": "gossip",
            "gossip.topology": "ring",
            "gossip.spread_clients": 0,
            "out": str(tmp_path / "run"),
            **extra,
        },
    )


class SameUpdate:
    """Every client's training returns the same update `step` (the Exchange interface):
    what the average model does is then arithmetic, not learning."""

    def __init__(self, step: torch.Tensor) -> None:
        self.step = step

    def exchange(
        self, requests: Mapping[int, Envelope], timeout_s: float | None
    ) -> dict[int, Envelope]:
        return {
            cid: Envelope(Kind.TRAIN, req.round, {F.LOSS: 0.0}, {F.DELTA: self.step.clone()})
            for cid, req in requests.items()
        }


def _average_step(cfg: RunConfig, rounds: int, tail: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The average model's mean move a round over the last `tail` of `rounds`, and the
    update every client returned."""
    engine = GossipEngine(cfg, make_task(cfg), SameUpdate(torch.zeros(1)))
    step = torch.linspace(-1e-3, 1e-3, engine.model.size)
    engine.transport = SameUpdate(step)
    engine.run(rounds - tail)
    start = average(engine.x).to(torch.float64)
    engine.run(tail)
    return (average(engine.x).to(torch.float64) - start) / tail, step.to(torch.float64)


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_momentum_multiplies_the_average_models_progress_by_one_over_one_minus_beta(
    tmp_path: Path, beta: float
) -> None:
    """Every client awake: mixing never moves the average, so it moves by each client's
    step; with momentum beta that step tends to Delta / (1 - beta) (0: exactly Delta)."""
    cfg = _cfg(tmp_path, **{"gossip.momentum": beta})
    moved, delta = _average_step(cfg, rounds=40, tail=5)
    assert torch.allclose(moved, delta / (1 - beta), rtol=1e-3, atol=1e-9)


def test_randomized_gossip_with_momentum_moves_the_average_faster(tmp_path: Path) -> None:
    """gossip.active = 3 of 12: plain gossip moves the average by K/n of the updates a
    round; quasi-global momentum (beta 0.5) tends to 1 / (1 - beta) = 2 times that, as
    the buffer spans a client's displacement since it last trained."""
    k, n = 3, 12
    plain, delta = _average_step(_cfg(tmp_path, **{"gossip.active": k}), rounds=20, tail=10)
    assert torch.allclose(plain, delta * k / n, rtol=1e-3, atol=1e-8)
    momentum, _ = _average_step(
        _cfg(tmp_path, **{"gossip.active": k, "gossip.momentum": 0.5}), rounds=120, tail=60
    )
    ratio = float(momentum.norm() / plain.norm())
    assert 1.8 < ratio < 2.2, ratio


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1, 0.995, "x"])
def test_momentum_out_of_range_is_refused_by_name(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError, match=r"gossip\.momentum = "):  # the value, named
        _cfg(tmp_path, **{"gossip.momentum": value})


def test_the_multi_process_run_refuses_momentum(tmp_path: Path) -> None:
    from fedveil.simulations.gossip.distributed import run_gossip_processes

    cfg = _cfg(tmp_path, **{"gossip.momentum": 0.5})
    with pytest.raises(ValueError, match=r"gossip\.momentum = 0\.5"):
        run_gossip_processes(cfg, 2, tmp_path / "ranks")
