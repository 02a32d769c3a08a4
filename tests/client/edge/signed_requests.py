"""A coordinator's signed DP training requests, answered through a device's own message path.

The device tests that check what a device does with the signed ledger head (witnessing
it: test_edge_ledger_witness.py; clocking DP-FTRL's participation schema by it:
test_edge_ftrl_participation.py) share this set-up: a real release mechanism with its
Ed25519-signed ledger (`SignedCoordinator`) builds each request as the round engine does
and releases rounds onto the ledger; `send` hands the request to the device as a Flower
Message through `answer`, with the device's pinned plan; `device` is an edge client with
a state directory (what a restart keeps)."""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from fedveil.builtin_models import build_model
from fedveil.client.edge.device_app import BAD_MESSAGE, CONFIG_KEY, EdgeClient, TaskSource, answer
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.config import RunConfig, device_toml
from fedveil.flat_model import FlatModel
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.server.engine.release_mechanism import ReleaseMechanism
from fedveil.server.engine.requests import build_train_request

SETUP = {"run_num_classes": 3, "run_input_shape": [8]}  # what DeployTransport adds
TASK = "deploy_task:make"


def model_weights() -> torch.Tensor:
    """The requests' global model: deploy_task's MLP (8 features, 3 classes), seed 0."""
    torch.manual_seed(0)
    return FlatModel(build_model("mlp", (8,), 3)).get()


def use_flower_run(run: int) -> None:
    """The Flower run (and node, task) the device's context names, as a SuperNode's."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run, 0, 1


class SignedCoordinator:
    """A coordinator's release mechanism (`stage`, with its signed ledger) and its
    training requests, as the round engine builds them."""

    def __init__(self, cfg: RunConfig, stage: ReleaseMechanism) -> None:
        self.cfg, self.stage = cfg, stage
        self.weights = model_weights()

    def request(self, round_num: int, head: bool = True) -> Envelope:
        """Round `round_num`'s training request; `head` False: without the ledger head."""
        env = build_train_request(self.cfg, round_num, self.weights, self.stage.client_fields())
        env.config.update(SETUP)
        if not head:
            env.config.pop(WITNESS_CONFIG_KEY)
        return env

    def release(self, round_num: int) -> None:
        """Release round `round_num` (noise only) onto the signed ledger."""
        self.stage.release(round_num, None, self.weights.numel())


def device(state: Path | None = None) -> EdgeClient:
    """An edge client; with `state`, its node's state directory (a restart keeps it)."""
    edge = EdgeClient(TaskSource(TASK), 0)
    if state is not None:
        EdgeNode(EdgeOptions("127.0.0.1:9092", 0, state, insecure=True), edge)
    return edge


def send(edge: EdgeClient, cfg: RunConfig, env: Envelope, flower_run: int) -> Message:
    """The device's answer to `env` (a Flower Message through `answer`), its plan pinned
    from `cfg`."""
    msg = Message(to_content(env), 5, message_type(env.kind))
    return answer(edge, msg, flower_run, {CONFIG_KEY: device_toml(cfg)})


def assert_trained(reply: Message) -> None:
    assert not reply.has_error(), reply.error.reason
    assert from_content(reply.content).config["num_examples"] > 0


def assert_refused(reply: Message, *words: str) -> None:
    assert reply.has_error() and reply.error.code == BAD_MESSAGE
    for word in words:
        assert word in reply.error.reason, reply.error.reason
