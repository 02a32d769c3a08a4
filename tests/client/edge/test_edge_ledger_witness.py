"""A device refuses to be the coordinator's unwitnessed party (issue 28).

Every request goes through the device's own message path (`answer`: a Flower Message in,
a Message out) and every head comes from a real coordinator stage (CentralDP with its
signed ledger, Ed25519 keys): the coordinator that omits the head, forges it, rolls the
ledger back or switches key is refused; an honest run trains, and the device pins the
ledger key, says so, and keeps what it saw, across a restart too.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

from fedveil.builtin_models import build_model
from fedveil.client.edge.device_app import (
    BAD_MESSAGE,
    CONFIG_KEY,
    EdgeClient,
    TaskSource,
    answer,
)
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.config import device_toml, load_config
from fedveil.flat_model import FlatModel
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY, entry_hash, signed_message
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.privacy.dp.verify import read_witness_file, verify_ledger
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.server.engine.central_release import CentralDP
from fedveil.server.engine.requests import build_train_request

N = 5
FLOWER_RUN = 77
SETUP = {"run_num_classes": 3, "run_input_shape": [8]}  # what DeployTransport adds
CENTRAL = {
    "model.name": "mlp",
    "model.task": "deploy_task:make",
    "data.num_clients": N,
    "server.per_round": N,
    "server.sampling": "fixed",
    "server.rounds": 4,
    "dp.mechanism": "central",
    "dp.epsilon": 50.0,
    "dp.noise_multiplier": 1.0,
}


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = FLOWER_RUN, 0, 1


def config(**extra):
    return load_config(None, {**CENTRAL, **extra})


class Coordinator:
    """A coordinator's DP stage and its training requests, as the round engine builds them."""

    def __init__(self, tmp_path, cfg, signer=None, name="ledger.jsonl"):
        self.cfg = cfg
        self.stage = CentralDP(
            cfg, N, tmp_path / name, run_id="run-1", signer=signer or LedgerSigner.generate()
        )
        torch.manual_seed(0)
        self.weights = FlatModel(build_model("mlp", (8,), 3)).get()

    def request(self, round_num, head=True):
        env = build_train_request(self.cfg, round_num, self.weights, self.stage.client_fields())
        env.config.update(SETUP)
        if not head:
            env.config.pop(WITNESS_CONFIG_KEY)
        return env

    def release(self, round_num):
        self.stage.release(round_num, None, self.weights.numel())


def send(edge, cfg, env):
    """The device's answer to `env` (a Flower Message through `answer`)."""
    msg = Message(to_content(env), 5, message_type(env.kind))
    return answer(edge, msg, FLOWER_RUN, {CONFIG_KEY: device_toml(cfg)})


def assert_trained(reply):
    assert not reply.has_error(), reply.error.reason
    assert from_content(reply.content).config["num_examples"] > 0


def assert_refused(reply, *words):
    assert reply.has_error() and reply.error.code == BAD_MESSAGE
    for word in words:
        assert word in reply.error.reason, reply.error.reason


def with_head(env, head):
    env.config[WITNESS_CONFIG_KEY] = json.dumps(head, sort_keys=True)
    return env


def test_an_honest_run_is_pinned_witnessed_and_verifiable(tmp_path, caplog):
    cfg = config()
    coordinator = Coordinator(tmp_path, cfg)
    opening = coordinator.stage.ledger.opening
    assert opening is not None and opening["seq"] == 1, "opened before round 1"
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    EdgeNode(EdgeOptions("127.0.0.1:9092", 0, tmp_path / "state", insecure=True), edge)
    with caplog.at_level(logging.INFO, logger="fedveil.edge"):
        for round_num in (1, 2, 3):
            assert_trained(send(edge, cfg, coordinator.request(round_num)))
            coordinator.release(round_num)
    pinned = [r.getMessage() for r in caplog.records if "pinned ledger key" in r.getMessage()]
    assert len(pinned) == 1 and opening["key_id"] in pinned[0]
    coordinator.stage.close("final", 3)
    witness = tmp_path / "state" / "witness" / "run-1.jsonl"
    assert [h["seq"] for h in read_witness_file(witness)] == [1, 2, 3]
    result = verify_ledger(
        coordinator.stage.ledger.path,
        public_key=coordinator.stage.ledger.signer.public_key_bytes,
        witnesses=read_witness_file(witness),
    )
    assert result.ok and result.witnesses == 3, result.message


def test_a_request_without_a_head_is_refused_from_round_1(tmp_path):
    cfg = config()
    coordinator = Coordinator(tmp_path, cfg)
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    assert_refused(send(edge, cfg, coordinator.request(1, head=False)), "no ledger.head")
    assert_trained(send(edge, cfg, coordinator.request(1)))
    coordinator.release(1)
    assert_refused(send(edge, cfg, coordinator.request(2, head=False)), "no ledger.head")
    # A masked-input training request is a DP training request too.
    masked = coordinator.request(2, head=False)
    masked = Envelope("secagg.masked_input", 2, masked.config, masked.arrays)
    assert_refused(send(edge, cfg, masked), "no ledger.head")


def test_a_dp_sgd_only_run_needs_a_head_too(tmp_path):
    cfg = config(**{"dp.mechanism": "none", "client.dp_sgd_noise": 1.0})
    coordinator = Coordinator(tmp_path, config())  # builds the request's model only
    env = build_train_request(cfg, 1, coordinator.weights, None)
    env.config.update(SETUP)
    assert_refused(send(EdgeClient(TaskSource("deploy_task:make"), 0), cfg, env), "no ledger.head")


def test_a_forged_head_is_refused(tmp_path):
    cfg = config()
    coordinator = Coordinator(tmp_path, cfg)
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    assert_trained(send(edge, cfg, coordinator.request(1)))
    coordinator.release(1)
    head = json.loads(coordinator.request(2).config[WITNESS_CONFIG_KEY])
    # An edited entry (a smaller epsilon) under its old hash and signature.
    edited = {**head, "entry": {**head["entry"], "epsilon": 0.01}}
    assert_refused(send(edge, cfg, with_head(coordinator.request(2), edited)), "hash")
    # Re-hashed, but signed by a key the device did not pin (key_id kept).
    other = LedgerSigner.generate()
    entry = {**edited["entry"]}
    entry["hash"] = entry_hash(entry)
    entry["signature"] = other.sign(signed_message(entry["hash"])).hex()
    assert_refused(
        send(edge, cfg, with_head(coordinator.request(2), {**head, "entry": entry})),
        "signature does not verify",
    )
    assert_trained(send(edge, cfg, coordinator.request(2)))


def test_a_rolled_back_ledger_is_refused_also_after_a_restart(tmp_path):
    cfg = config()
    coordinator = Coordinator(tmp_path, cfg)
    state = tmp_path / "state"
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    EdgeNode(EdgeOptions("127.0.0.1:9092", 0, state, insecure=True), edge)
    old = coordinator.request(2)  # the head at seq 1 (the opening)
    for round_num in (1, 2):
        assert_trained(send(edge, cfg, coordinator.request(round_num)))
        coordinator.release(round_num)
    assert_refused(send(edge, cfg, old), "rolled back")
    # A restarted device keeps its pin and the highest seq it saw.
    restarted = EdgeClient(TaskSource("deploy_task:make"), 0)
    EdgeNode(EdgeOptions("127.0.0.1:9092", 0, state, insecure=True), restarted)
    assert_refused(send(restarted, cfg, old), "rolled back")
    assert_trained(send(restarted, cfg, coordinator.request(3)))


def test_a_switched_key_or_restarted_ledger_is_refused(tmp_path):
    cfg = config()
    coordinator = Coordinator(tmp_path, cfg)
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    assert_trained(send(edge, cfg, coordinator.request(1)))
    coordinator.release(1)
    # The coordinator starts a second ledger for the same run, under a new key.
    switched = Coordinator(tmp_path, cfg, name="second.jsonl")
    assert_refused(send(edge, cfg, switched.request(2)), "changed key")
    # Or keeps the key's id but opens a second chain: not the pinned opening either.
    again = Coordinator(tmp_path, cfg, signer=coordinator.stage.ledger.signer, name="third.jsonl")
    assert_refused(send(edge, cfg, again.request(2)), "pinned run")
    assert_trained(send(edge, cfg, coordinator.request(2)))
