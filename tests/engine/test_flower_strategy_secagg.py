"""Secure aggregation for Flower's averaging strategies (issue 19), on Flower's real
simulation engine: a stock FedAvg ServerApp gains fedveil's secure aggregation by
`strategy.start(grid=secure(grid, strategy), ...)`, its quickstart ClientApp by
`ClientApp(mods=[fedveil_secagg_mod])` (tests/flower_secagg_app.py).

The reference is plain FedAvg on the same cohorts (every node, every round): the same
clients' train function run here, averaged by Flower's own aggregate_arrayrecords.
"""

from __future__ import annotations

import time
from typing import Any

import flower_quickstart_app as quickstart
import flower_secagg_app
import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import Metadata
from flwr.server import Grid
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg, FedMedian, Krum
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from flwr.simulation import run_simulation
from local_ray import local_ray

from fedveil.flower import FlowerDP, SecAggGrid, StrategyRefused, secure
from fedveil.protocol import flower_secagg_codec as codec
from fedveil.server.engine.flower_secagg import SecureSettings

CLIENTS = 4
ROUNDS = 2
SETTINGS = SecureSettings()
# The protocol quantises each client's w_i * x_i / W to steps of 2r / (L - 1), rounding
# stochastically: the mean's error per value is at most n * step * W / sum(w) per round.
STEP = 2 * SETTINGS.clip_range / (SETTINGS.levels - 1)
WEIGHTS = [flower_secagg_app.weight_of(p) for p in range(CLIENTS)]
ROUND_BOUND = CLIENTS * STEP * SETTINGS.max_weight / sum(WEIGHTS)
TOLERANCE = 4 * ROUNDS * ROUND_BOUND  # (round 2 starts from round 1's slightly other model)


# Every node in every round (min_*_nodes: even if some connect after round 1 is set up).
EVERY_NODE: dict[str, Any] = {
    "fraction_train": 1.0,
    "fraction_evaluate": 1.0,
    "min_train_nodes": CLIENTS,
    "min_evaluate_nodes": CLIENTS,
    "min_available_nodes": CLIENTS,
}


class RecordingGrid:
    """The server's view: every reply that reaches it, as the strategy's Grid sees them."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.replies: list[Message] = []
        self.exchanges = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.replies.extend(replies)
        self.exchanges += 1
        return replies

    # The secure exchanges push once and pull replies as they arrive (grid_replies).
    def push_messages(self, messages: Any) -> list[str]:
        self.exchanges += 1
        return list(self.grid.push_messages(messages))

    def pull_messages(self, message_ids: Any) -> list[Message]:
        replies = list(self.grid.pull_messages(message_ids))
        self.replies.extend(replies)
        return replies


def _initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(quickstart.Net().state_dict())


def _plain_round(arrays: ArrayRecord, server_round: int, uniform: bool) -> tuple[ArrayRecord, list]:
    """Plain FedAvg's round over every client, and each client's update (flat)."""
    replies, updates = [], []
    before = _flat(arrays)
    for partition in range(CLIENTS):
        msg = Message(
            RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})}),
            dst_node_id=partition + 1,
            message_type="train",
        )
        context = Context(0, partition + 1, {"partition-id": partition}, RecordDict(), {})
        reply = flower_secagg_app.train(msg, context).content
        if uniform:
            reply["metrics"]["num-examples"] = 1
        replies.append(reply)
        updates.append(_flat(reply["arrays"]) - before)
    return aggregate_arrayrecords(replies, "num-examples"), updates


def _delivered(message_type: str, content: RecordDict, node_id: int) -> Message:
    """A message as a SuperNode delivers it to the ClientApp."""
    metadata = Metadata(
        run_id=1,
        message_id=f"m{node_id}",
        src_node_id=0,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id="",
        created_at=time.time(),
        ttl=60.0,
        message_type=message_type,
    )
    return Message(content=content, metadata=metadata)


def _flat(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().astype(np.float64).ravel() for a in arrays.values()])


def _run(main: Any) -> None:
    local_ray()  # this session's own Ray (tests/local_ray.py)
    app = ServerApp()
    app.main()(main)
    run_simulation(
        server_app=app,
        client_app=flower_secagg_app.app,
        num_supernodes=CLIENTS,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.slow
def test_fedavg_app_gains_secure_aggregation_and_dp() -> None:
    out: dict[str, Any] = {}

    def main(grid: Grid, context: Context) -> None:
        # The app's own server, as a Flower user writes it, with the one changed line.
        strategy = FedAvg(**EVERY_NODE)
        seen = RecordingGrid(grid)
        wrapped = secure(seen, strategy)
        out["plain"] = strategy.start(grid=wrapped, initial_arrays=_initial(), num_rounds=ROUNDS)
        out["seen"], out["wrapped"] = seen, wrapped
        dp = FedAvg(**EVERY_NODE)
        big_clip = FlowerDP(clip=1e3, noise_multiplier=1e-10)  # DP's weighting, ~no noise
        out["dp"] = dp.start(
            grid=secure(grid, dp, dp=big_clip), initial_arrays=_initial(), num_rounds=1
        )

    _run(main)
    # Every client took part in every secure exchange (first: a client lost under load
    # would otherwise show as a model mismatch below).
    wrapped: SecAggGrid = out["wrapped"]
    assert [r["aggregated"] for r in wrapped.rounds] == [CLIENTS] * (2 * ROUNDS), wrapped.rounds

    # The global model is plain FedAvg's on the same cohorts, within the quantisation.
    arrays, updates = _initial(), []
    for server_round in range(1, ROUNDS + 1):
        arrays, round_updates = _plain_round(arrays, server_round, uniform=False)
        updates.append(round_updates)
    secure_model = _flat(out["plain"].arrays)
    plain_model = _flat(arrays)
    assert not np.allclose(plain_model, _flat(_initial()))  # it trained
    np.testing.assert_allclose(secure_model, plain_model, rtol=0, atol=TOLERANCE)
    # FedAvg's per-client train_loss was averaged inside the protocol (weighted).
    losses = out["plain"].train_metrics_clientapp[1]
    assert 0 < losses["train_loss"] < 5
    evaluated = out["plain"].evaluate_metrics_clientapp[ROUNDS]
    # Metrics travel scaled by r / metric_range, so their bound is that much wider.
    metric_bound = ROUND_BOUND * SETTINGS.metric_range / SETTINGS.clip_range
    assert 0.5 < evaluated["eval_acc"] <= 1.0 + metric_bound

    # The server never saw an individual update: every reply carries only the protocol's
    # records, and a masked input decoded on its own is noise, not the client's update.
    seen: RecordingGrid = out["seen"]
    assert seen.replies
    for reply in seen.replies:
        assert not reply.has_error(), reply.error.reason
        assert all(name.startswith(codec.PREFIX) for name in reply.content), list(reply.content)
    masked = [
        codec.unpack(r.content).arrays["sa.masked_vector"]
        for r in seen.replies
        if "sa.masked_vector" in codec.unpack(r.content).arrays
    ]
    assert len(masked) == CLIENTS * 2 * ROUNDS  # train: update and loss; evaluate: metrics
    size = plain_model.size
    masked_train = [m for m in masked if m.size > size][:CLIENTS]  # round 1's train inputs
    for vector, update, weight in zip(masked_train, updates[0], WEIGHTS, strict=False):
        alone = (vector[:size].astype(np.float64) * STEP - SETTINGS.clip_range) * (
            SETTINGS.max_weight / weight
        )
        assert np.abs(alone - update).mean() > 100 * np.abs(update).mean()
    # Round 2's key stages rode on round 1's exchanges: training took 4 + 2 exchanges,
    # not 4 + 4 (each evaluation takes 4).
    assert seen.exchanges == (4 + 2) + 4 * ROUNDS

    # Under DP every client weighs 1, whatever num-examples it reports; no client metrics.
    uniform, _ = _plain_round(_initial(), 1, uniform=True)
    weighted, _ = _plain_round(_initial(), 1, uniform=False)
    dp_model = _flat(out["dp"].arrays)
    dp_step = 2 * SETTINGS.clip_range / (SETTINGS.levels - 1)
    np.testing.assert_allclose(dp_model, _flat(uniform), rtol=0, atol=4 * dp_step)
    assert np.abs(dp_model - _flat(weighted)).max() > 100 * dp_step
    assert out["dp"].evaluate_metrics_clientapp == {}
    assert dict(out["dp"].train_metrics_clientapp.get(1, {})) == {}


@pytest.mark.parametrize("strategy", [Krum(), FedMedian()], ids=["krum", "fedmedian"])
def test_strategies_needing_each_update_are_refused(strategy: FedAvg) -> None:
    with pytest.raises(StrategyRefused, match="needs every client's update") as refused:
        secure(None, strategy)  # type: ignore[arg-type]
    assert type(strategy).__name__ in str(refused.value)


@pytest.mark.procs
@pytest.mark.parametrize(
    "name", ["FedAvg", "FedProx", "FedAvgM", "FedAdam", "FedYogi", "FedAdagrad"]
)
def test_averaging_strategies_are_served(name: str) -> None:
    import flwr.serverapp.strategy as strategies

    strategy = getattr(strategies, name)()
    assert isinstance(secure(object(), strategy), SecAggGrid)  # type: ignore[arg-type]


def test_plain_messages_are_refused_by_the_client_mod() -> None:
    from fedveil.client.flower_secagg_mod import fedveil_secagg_mod

    arrays = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    msg = _delivered("train", RecordDict({"arrays": arrays}), 1)
    called = []
    context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
    reply = fedveil_secagg_mod(msg, context, lambda m, c: called.append(m) or m)
    assert reply.has_error() and "only inside fedveil's secure aggregation" in reply.error.reason
    assert called == []  # the app never ran: no plain update was made to leak


def test_dp_epsilon_follows_rounds_and_noise() -> None:
    low, high = FlowerDP(clip=1.0, noise_multiplier=1.1), FlowerDP(clip=1.0, noise_multiplier=4.0)
    ten = low.epsilon(10, 10, 100, 1e-5)
    assert 0 < ten < low.epsilon(100, 10, 100, 1e-5)
    assert high.epsilon(10, 10, 100, 1e-5) < ten
    with pytest.raises(ValueError, match="noise_multiplier"):
        FlowerDP(clip=1.0, noise_multiplier=0.0)
    with pytest.raises(ValueError, match="cohort = 200"):
        low.epsilon(10, 200, 100, 1e-5)
