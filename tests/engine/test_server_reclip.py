"""Central DP without secure aggregation: the server enforces the clip and weight 1.

The accountant assumes each client moves the sum by at most C. A client that ignores the
requested clip and claims a large weight must not move it further: the server re-clips
every update it receives in the clear and counts the ones it had to change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import pytest
import torch

from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.aggregation import RECLIPPED, Aggregate, PlainChannel
from fedveil.server.engine.transport import ClientFailure, ReplySink

CLIP = 0.5
DIM = 64
DP_CONFIG = {"clip_norm": CLIP, "weighting": "uniform"}


class ScriptedClients:
    """Clients whose replies are fixed up front: the adversary chooses what it sends."""

    def __init__(self, replies: dict[int, Envelope]) -> None:
        self.replies = replies

    def client_ids(self) -> list[int]:
        return sorted(self.replies)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        return {cid: self.replies[cid] for cid in requests}

    def close(self) -> None:
        pass


def train_reply(delta: torch.Tensor, weight: float, loss: float = 0.5) -> Envelope:
    config = {"num_examples": 10, "loss": loss, "weight": weight}
    return Envelope("train", 1, config, {"delta": delta.to(torch.float32)})


def honest_updates() -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    updates = {cid: torch.randn(DIM, generator=g) for cid in range(3)}
    # Clipped on the client as the runtime does: a hair under C, or already inside it.
    updates[0] *= CLIP * (1 - 2**-20) / torch.linalg.vector_norm(updates[0])
    updates[1] *= 0.3 * CLIP / torch.linalg.vector_norm(updates[1])
    updates[2] *= CLIP * (1 - 2**-20) / torch.linalg.vector_norm(updates[2])
    return updates


def collect(replies: dict[int, Envelope], config: dict[str, object]) -> Aggregate | None:
    requests = {cid: Envelope("train", 1, dict(config)) for cid in replies}
    return PlainChannel().collect(ScriptedClients(replies), requests, DIM, None)


def test_a_client_ignoring_the_clip_moves_the_sum_by_at_most_c() -> None:
    honest = {cid: train_reply(u, 1.0) for cid, u in honest_updates().items()}
    without = collect(honest, DP_CONFIG)
    assert without is not None and without.extras[RECLIPPED] == 0
    attack = torch.randn(DIM, generator=torch.Generator().manual_seed(1))
    attack *= 100 * CLIP / torch.linalg.vector_norm(attack)
    with_adversary = collect({**honest, 7: train_reply(attack, 50.0)}, DP_CONFIG)
    assert with_adversary is not None
    moved = torch.linalg.vector_norm((with_adversary.total - without.total).double())
    assert moved <= CLIP * (1 + 1e-6)
    assert with_adversary.weight == without.weight + 1 == 4
    assert with_adversary.extras[RECLIPPED] == 1
    # The adversary's update is re-clipped, not dropped: it still counts as one client.
    assert with_adversary.contributors == [0, 1, 2, 7]


def test_honest_updates_pass_bit_for_bit_and_a_weight_alone_is_counted() -> None:
    updates = honest_updates()
    honest = {cid: train_reply(u, 1.0) for cid, u in updates.items()}
    agg = collect(honest, DP_CONFIG)
    assert agg is not None
    assert torch.equal(agg.total, updates[0] + updates[1] + updates[2])
    # A small update with weight 3: only the weight is wrong, and it is still counted.
    heavy = collect({**honest, 5: train_reply(updates[1], 3.0)}, DP_CONFIG)
    assert heavy is not None and heavy.extras[RECLIPPED] == 1 and heavy.weight == 4


def test_non_finite_updates_drop_the_client() -> None:
    updates = honest_updates()
    replies = {cid: train_reply(u, 1.0) for cid, u in updates.items()}
    bad = torch.zeros(DIM)
    bad[3] = float("nan")
    worse = torch.zeros(DIM)
    worse[5] = float("inf")
    agg = collect({**replies, 8: train_reply(bad, 1.0), 9: train_reply(worse, 1.0)}, DP_CONFIG)
    assert agg is not None
    assert agg.contributors == [0, 1, 2]
    assert set(agg.dropped) == {8, 9} and "NaN or Inf" in agg.dropped[8]


def test_the_log_names_no_client(caplog: pytest.LogCaptureFixture) -> None:
    honest = {cid: train_reply(u, 1.0) for cid, u in honest_updates().items()}
    attack = torch.full((DIM,), 10.0)
    with caplog.at_level(logging.DEBUG, logger="fedveil.aggregation"):
        collect({**honest, 4242: train_reply(attack, 1.0)}, DP_CONFIG)
    assert caplog.records and all("4242" not in r.getMessage() for r in caplog.records)
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)


def test_without_dp_the_server_changes_nothing() -> None:
    """No clip requested: weights and norms are the clients' (FedAvg by examples)."""
    big = torch.full((DIM,), 10.0)
    small = torch.full((DIM,), 0.25)
    agg = collect({0: train_reply(big, 30.0), 1: train_reply(small, 10.0)}, {})
    assert agg is not None and RECLIPPED not in agg.extras
    assert agg.weight == 40.0
    np.testing.assert_array_equal(agg.total.numpy(), (big * 30.0 + small * 10.0).numpy())
