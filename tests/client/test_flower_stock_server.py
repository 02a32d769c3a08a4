"""fedveil's ClientApp under a stock Flower server (flwr.serverapp.strategy.FedAvg).

The server side is written as in Flower's quickstart, with no fedveil import: it knows
only the model's architecture and Flower's conventions ("arrays", "config" with
"server-round" and "lr"; replies "arrays" and "metrics" with "num-examples").
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict
from flwr.server import Grid
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn

TESTS = Path(__file__).resolve().parents[1]
FEATURES, CLASSES, CLIENTS, ROUNDS = 8, 3, 2, 2


# -- the stock server: Flower's quickstart, no fedveil --------------------------------
def stock_net() -> nn.Module:
    """tests/tiny_task.py's model, as the server's own code defines it."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


RESULT: dict[str, object] = {}
server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    initial = ArrayRecord(stock_net().state_dict())
    # Every node, also one that registers late: FedAvg sizes its sample from the nodes
    # connected at that moment, before it waits for min_available_nodes.
    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=1.0,
        min_train_nodes=CLIENTS,
        min_evaluate_nodes=CLIENTS,
        min_available_nodes=CLIENTS,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=ROUNDS,
        train_config=ConfigRecord({"lr": 0.1}),
    )
    RESULT.update(initial=initial.to_torch_state_dict(), result=result)


# -- fedveil's client ------------------------------------------------------------------
def client_config(**extra: object):
    from fedveil.config import load_config

    return load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": CLIENTS,
            "server.per_round": CLIENTS,
            **extra,
        },
    )


@pytest.mark.procs
@pytest.mark.flower
@pytest.mark.slow
def test_fedveil_client_app_trains_under_a_stock_fedavg_server(monkeypatch):
    from fedveil.flower import client_app

    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # Ray workers import tiny_task
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)  # for this test only: the session's later tests log
    RESULT.clear()
    try:
        run_simulation(
            server_app=server,
            client_app=client_app(client_config()),
            num_supernodes=CLIENTS,
            backend_config={"client_resources": {"num_cpus": 1.0, "num_gpus": 0.0}},
        )
    finally:
        flwr_log.setLevel(level)
    result = RESULT["result"]
    initial, final = RESULT["initial"], result.arrays.to_torch_state_dict()
    assert list(final) == list(initial)  # the state_dict's keys, in its order
    assert any(not torch.equal(initial[k], final[k]) for k in initial)
    train = result.train_metrics_clientapp
    evals = result.evaluate_metrics_clientapp
    assert sorted(train) == list(range(1, ROUNDS + 1)), train  # every round had replies
    assert train[ROUNDS]["train_loss"] < train[1]["train_loss"]
    assert evals[ROUNDS]["eval_loss"] < evals[1]["eval_loss"]
    assert 0.0 <= evals[ROUNDS]["eval_acc"] <= 1.0


# -- one message at a time, as a SuperNode delivers them ---------------------------------
def delivered(message_type: str, content: RecordDict, node_id: int = 5) -> Message:
    return Message(
        content=content,
        metadata=Metadata(
            run_id=1,
            message_id=f"m{node_id}",
            src_node_id=0,
            dst_node_id=node_id,
            reply_to_message_id="",
            group_id="",
            created_at=time.time(),
            ttl=60.0,
            message_type=message_type,
        ),
    )


def stock_content(state: dict[str, torch.Tensor], **config: object) -> RecordDict:
    return RecordDict(
        {"arrays": ArrayRecord(state), "config": ConfigRecord({"server-round": 1, **config})}
    )


def test_stock_train_reply_carries_trained_arrays_and_fedavg_metrics():
    from fedveil.flower import client_app

    app = client_app(client_config())
    state = stock_net().state_dict()
    context = Context(1, 5, {"partition-id": 1}, RecordDict(), {})
    reply = app(delivered("train", stock_content(state, lr=0.2)), context)
    assert not reply.has_error(), reply.error
    trained = reply.content["arrays"].to_torch_state_dict()
    assert list(trained) == list(state)
    assert not torch.equal(trained["0.weight"], state["0.weight"])
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] > 0 and metrics["train_loss"] > 0

    reply = app(delivered("evaluate", stock_content(state)), context)
    assert not reply.has_error(), reply.error
    assert set(reply.content["metrics"]) == {"num-examples", "eval_loss", "eval_acc"}


def test_stock_train_of_another_model_is_refused_naming_the_tensor():
    from fedveil.flower import client_app

    app = client_app(client_config())
    state = stock_net().state_dict()
    state["0.weight"] = torch.zeros(16, FEATURES + 1)
    context = Context(1, 5, {"partition-id": 0}, RecordDict(), {})
    reply = app(delivered("train", stock_content(state)), context)
    assert reply.has_error() and "0.weight" in reply.error.reason


def test_a_client_that_needs_secure_aggregation_refuses_a_stock_train():
    # Its update would leave in the clear to a server that never masks it.
    from fedveil.flower import client_app

    app = client_app(client_config(**{"secagg.enabled": True}))
    state = stock_net().state_dict()
    context = Context(1, 5, {"partition-id": 1}, RecordDict(), {})
    reply = app(delivered("train", stock_content(state)), context)
    assert reply.has_error()
    assert "secure aggregation" in reply.error.reason and "clear" in reply.error.reason
    # Evaluation sends no update: still answered.
    reply = app(delivered("evaluate", stock_content(state)), context)
    assert not reply.has_error(), reply.error


def test_a_client_under_distributed_dp_refuses_a_stock_evaluate():
    # Its accuracy and loss would reach the server un-noised, outside the epsilon stated
    # against the coordinator; a stock train is refused as under any secure aggregation.
    from fedveil.flower import client_app

    distributed = {"secagg.enabled": True, "dp.mechanism": "distributed", "dp.epsilon": 8.0}
    app = client_app(client_config(**distributed))
    state = stock_net().state_dict()
    context = Context(1, 5, {"partition-id": 1}, RecordDict(), {})
    for mtype in ("train", "evaluate"):
        reply = app(delivered(mtype, stock_content(state)), context)
        assert reply.has_error() and not reply.has_content()
        assert "clear" in reply.error.reason
    assert "dp.mechanism = 'distributed'" in reply.error.reason
