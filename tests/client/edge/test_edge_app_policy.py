"""Which Flower apps a device takes part in is its own policy (--allow-app), and a stock
Flower server's train message never takes an update in the clear from a device that
requires secure aggregation."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedveil.cli.main import main
from fedveil.client.edge.device_app import (
    BAD_MESSAGE,
    EdgeClient,
    TaskSource,
    answer,
    edge_from_node_config,
)
from fedveil.client.edge.edge_policy import LocalPolicy
from fedveil.protocol.deployment import CLIENTAPP_REF, FAB_ID

OTHER = "acme/quickstart-pytorch"


@pytest.fixture(autouse=True)
def task_identity():
    # Flower stamps messages with the task they belong to; the worker sets it per task.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 77, 0, 1


def test_by_default_a_device_runs_only_the_coordinators_app():
    policy = LocalPolicy()
    assert policy.app_refusal(FAB_ID, CLIENTAPP_REF) is None
    refusal = policy.app_refusal(OTHER, CLIENTAPP_REF)
    # The refusal names the app and the flag that would allow it.
    assert refusal is not None
    assert OTHER in refusal and f"--allow-app {OTHER}" in refusal and FAB_ID in refusal


def test_an_allowed_app_runs_but_only_with_the_devices_own_clientapp():
    policy = LocalPolicy(allow_apps=(OTHER,))
    assert policy.app_refusal(OTHER, CLIENTAPP_REF) is None
    assert policy.app_refusal(FAB_ID, CLIENTAPP_REF) is None  # the coordinator's stays allowed
    # An app that brings its own ClientApp: the device never runs code an app brings.
    refusal = policy.app_refusal(OTHER, "task:app")
    assert refusal is not None and "'task:app'" in refusal and CLIENTAPP_REF in refusal
    assert policy.app_refusal("acme/other", CLIENTAPP_REF) is not None
    assert OTHER in policy.describe()


@pytest.mark.parametrize("bad", ["quickstart", "/x", "a/", "a/b/c", " a/b"])
def test_an_allow_app_that_is_not_a_fab_id_is_refused(bad):
    with pytest.raises(ValueError, match=r"--allow-app.*publisher/name"):
        LocalPolicy(allow_apps=(bad,))


def test_the_cli_flag_and_the_node_config_set_the_policy(capsys):
    code = main(
        [
            "client",
            "--server",
            "127.0.0.1:1",
            "--client-id",
            "0",
            "--task",
            "deploy_task:make",
            "--allow-app",
            "no-slash",
        ]
    )
    assert code == 2 and "--allow-app" in capsys.readouterr().err
    edge = edge_from_node_config(
        {"client-id": 0, "task": "deploy_task:make", "allow-apps": f"{OTHER} acme/b"}
    )
    assert edge.policy.allow_apps == (OTHER, "acme/b")


def stock_message(message_type: str) -> Message:
    """A stock flwr.serverapp.strategy.FedAvg request: the state_dict and 'server-round'."""
    state = {"w": torch.zeros(3)}
    content = RecordDict(
        {"arrays": ArrayRecord(state), "config": ConfigRecord({"server-round": 1, "lr": 0.1})}
    )
    return Message(content, 5, message_type)


@pytest.mark.procs
def test_a_device_requiring_secagg_refuses_a_stock_train_saying_why():
    edge = EdgeClient(TaskSource("deploy_task:make"), 0, LocalPolicy(require_secagg=True))
    reply = answer(edge, stock_message("train"), 1, {})
    assert reply.has_error() and reply.error.code == BAD_MESSAGE
    reason = reply.error.reason
    assert "requires secure aggregation" in reason and "in the clear" in reason


@pytest.mark.procs
def test_a_device_answers_stock_messages_with_a_refusal_naming_them():
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    for mtype in ("train", "evaluate"):
        reply = answer(edge, stock_message(mtype), 1, {})
        assert reply.has_error() and f"stock Flower {mtype!r}" in reply.error.reason
