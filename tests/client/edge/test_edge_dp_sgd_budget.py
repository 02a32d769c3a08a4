"""A device accounts its own DP-SGD epsilon from what it trains and refuses a coordinator
that asks for more than its cap (--max-dp-epsilon), across requests and restarts; and under
DP-SGD nothing leaves the device but the update (no example count, rate or loss).

Every request goes through the device's real message path: `answer` takes the Flower
Message a SuperNode hands the worker and returns the reply Message it pushes back."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch
from deploy_task import arrays
from flwr.app import Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from ledger_heads import with_ledger_head

from fedveil.builtin_models import build_model
from fedveil.client.dpsgd_budget import DpSgdLedger
from fedveil.client.edge.device_app import (
    BAD_MESSAGE,
    CONFIG_KEY,
    EdgeClient,
    TaskSource,
    edge_from_node_config,
)
from fedveil.client.edge.device_app import answer as device_answer
from fedveil.client.edge.edge_policy import LocalPolicy
from fedveil.config import device_toml, load_config
from fedveil.flat_model import FlatModel
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import from_content, message_type, to_content

N = 5
CAP = 6.5  # client 0 (49 examples), z = 1, batch 16: one epoch-round 4.51, two 5.95, three 7.08
RUN = 41


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 77, 0, 1


def run_config() -> dict[str, str]:
    overrides = {
        "model.name": "mlp",
        "model.task": "deploy_task:make",
        "data.num_clients": N,
        "server.per_round": N,
        "client.dp_sgd_noise": 1.0,
        "client.dp_sgd_clip": 1.0,
        # A run that allows up to 20 epochs of batches of 16: what these tests ask for is
        # within the run config (client/dpsgd_pin.py), so the device's own cap decides.
        "client.batch_size": 16,
        "client.local_epochs": 20,
    }
    return {CONFIG_KEY: device_toml(load_config(None, overrides))}


def dp_sgd_request(round_num: int, **config: object) -> Envelope:
    """A DP-SGD training request as the round engine builds it; `config` overrides what a
    coordinator chooses (epochs, batch size, noise)."""
    torch.manual_seed(0)
    base: dict[str, object] = {
        "seed": 3,
        "local_epochs": 1,
        "local_steps": 0,
        "batch_size": 16,
        "lr": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
        "prox_mu": 0.0,
        "dp_sgd_noise": 1.0,
        "dp_sgd_clip": 1.0,
        "weighting": "uniform",
        "run_num_classes": 3,
        "run_input_shape": [8],
    }
    base.update(config)
    model = FlatModel(build_model("mlp", (8,), 3))
    return Envelope("train", round_num, base, {"model": model.get()})


def send(edge: EdgeClient, request: Envelope) -> Message:
    # The coordinator's head rides on every request: what is tested here is the cap.
    content: RecordDict = to_content(with_ledger_head(request))
    return device_answer(edge, Message(content, 5, message_type(request.kind)), RUN, run_config())


def device(ledger_dir, cap: float = CAP, client_id: int = 0) -> EdgeClient:
    """A device as `fedveil client --max-dp-epsilon CAP --state-dir ...` builds it."""
    policy = LocalPolicy(max_dp_epsilon=cap)
    ledger = DpSgdLedger(ledger_dir, policy.max_dp_epsilon, policy.dp_delta)
    return EdgeClient(TaskSource("deploy_task:make"), client_id, policy, dp_sgd_ledger=ledger)


def refused_figure(reply: Message) -> float:
    assert reply.has_error() and reply.error.code == BAD_MESSAGE, reply
    reason = reply.error.reason
    assert f"--max-dp-epsilon {CAP:g}" in reason, reason
    return float(re.search(r"epsilon to ([0-9.]+)", reason).group(1))


def test_a_coordinator_asking_past_the_cap_is_refused_also_after_a_restart(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fedveil.edge")
    ledger_dir = tmp_path / "state" / "dp_sgd"
    first = device(ledger_dir)
    assert not send(first, dp_sgd_request(1)).has_error()
    assert "DP-SGD epsilon of this device" in caplog.text  # the figure is in its log
    # More epochs, or a batch as large as its data (no amplification by sampling): each
    # takes this device past its cap, whatever noise floor the request keeps.
    assert refused_figure(send(first, dp_sgd_request(2, local_epochs=20))) > CAP
    assert refused_figure(send(first, dp_sgd_request(2, batch_size=49, local_epochs=3))) > CAP
    assert "DP-SGD refused" in caplog.text
    assert not send(first, dp_sgd_request(2)).has_error()  # refused rounds cost nothing
    # The device restarts (a new process): its DP-SGD rounds are on disk, the cap holds.
    restarted = device(ledger_dir)
    reply = send(restarted, dp_sgd_request(3))
    figure = refused_figure(reply)
    assert CAP < figure < 8  # three modest rounds: 7.08
    assert "spent so far: 5.9" in reply.error.reason
    # The same request to a device with no history is accepted: the refusal is the history.
    assert not send(device(tmp_path / "fresh"), dp_sgd_request(3)).has_error()


@pytest.mark.parametrize("noise", [None, 0.0, math.nan, "1.0"])
def test_under_a_cap_training_without_dp_sgd_is_refused(tmp_path, noise):
    request = dp_sgd_request(1)
    request.config.pop("dp_sgd_noise")
    if noise is not None:
        request.config["dp_sgd_noise"] = noise
    reply = send(device(tmp_path), request)
    assert reply.has_error() and reply.error.code == BAD_MESSAGE
    assert "dp_sgd_noise" in reply.error.reason and "unbounded" in reply.error.reason


def test_the_node_config_sets_the_cap_and_the_ledger(tmp_path):
    edge = edge_from_node_config(
        {"client-id": 0, "task": "deploy_task:make", "max-dp-epsilon": 3.0, "state-dir": tmp_path}
    )
    assert edge.policy.max_dp_epsilon == 3.0 and edge.dp_sgd_ledger is not None
    with pytest.raises(ValueError, match="max_dp_epsilon"):
        edge_from_node_config({"client-id": 0, "task": "deploy_task:make", "max-dp-epsilon": 3})


def test_a_dp_sgd_reply_tells_the_coordinator_nothing_about_the_data(tmp_path):
    """The coordinator reading replies: two devices with different example counts send the
    same constants (one vote, no loss, no rate); only the noised update differs."""
    sizes = [len(y) for _, y in arrays(N)[0]]
    assert sizes[0] != sizes[1]
    configs = []
    for cid in (0, 1):
        edge = device(tmp_path / str(cid), cap=0.0, client_id=cid)  # accounted, no cap
        reply = send(edge, dp_sgd_request(1))
        assert not reply.has_error()
        configs.append(from_content(reply.content).config)
    assert configs[0] == configs[1] == {"num_examples": 1, "loss": 0.0, "weight": 1.0}
    # Example weighting would need n on the server: refused, naming the field.
    reply = send(device(tmp_path / "w", cap=0.0), dp_sgd_request(1, weighting="examples"))
    assert reply.has_error() and "weighting = 'examples'" in reply.error.reason
