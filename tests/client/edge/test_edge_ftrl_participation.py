"""A device keeps its side of DP-FTRL's participation schema (issue 35).

Requests go through the device's own message path (`answer`: a Flower Message in, a
Message out), built by the real DP-FTRL stage with its signed ledger: the device counts
its participations in its state directory (a restart keeps them) and clocks the
separation by the release index of the signed ledger head it verified.
"""

from __future__ import annotations

import json

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
from fedveil.protocol.flower_codec import from_content, message_type, to_content
from fedveil.server.engine.ftrl_stage import FtrlDP
from fedveil.server.engine.requests import build_train_request

N = 5
FLOWER_RUN = 78
SETUP = {"run_num_classes": 3, "run_input_shape": [8]}
FTRL = {
    "model.name": "mlp",
    "model.task": "deploy_task:make",
    "data.num_clients": N,
    "server.per_round": N,
    "server.sampling": "fixed",
    "server.rounds": 8,
    "dp.mechanism": "ftrl",
    "dp.ftrl_factorization": "tree",
    "dp.ftrl_min_separation": 2,
    "dp.ftrl_max_participations": 2,
    "dp.epsilon": 50.0,
    "dp.noise_multiplier": 1.0,
}


def setup_module() -> None:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = FLOWER_RUN, 0, 1


class Coordinator:
    def __init__(self, tmp_path):
        self.cfg = load_config(None, FTRL)
        torch.manual_seed(0)
        self.weights = FlatModel(build_model("mlp", (8,), 3)).get()
        self.stage = FtrlDP(
            self.cfg,
            N,
            tmp_path / "ledger.jsonl",
            model_size=self.weights.numel(),
            run_id="ftrl-run",
            signer=LedgerSigner.generate(),
        )

    def request(self, round_num):
        env = build_train_request(self.cfg, round_num, self.weights, self.stage.client_fields())
        env.config.update(SETUP)
        return env

    def release(self, round_num):
        self.stage.release(round_num, None, self.weights.numel())


def send(edge, cfg, env):
    msg = Message(to_content(env), 5, message_type(env.kind))
    return answer(edge, msg, FLOWER_RUN, {CONFIG_KEY: device_toml(cfg)})


def assert_trained(reply):
    assert not reply.has_error(), reply.error.reason
    assert from_content(reply.content).config["num_examples"] > 0


def assert_refused(reply, *words):
    assert reply.has_error() and reply.error.code == BAD_MESSAGE
    for word in words:
        assert word in reply.error.reason, reply.error.reason


def device(state):
    edge = EdgeClient(TaskSource("deploy_task:make"), 0)
    EdgeNode(EdgeOptions("127.0.0.1:9092", 0, state, insecure=True), edge)
    return edge


def test_at_most_k_participations_also_after_a_restart(tmp_path):
    coordinator = Coordinator(tmp_path)
    cfg, state = coordinator.cfg, tmp_path / "state"
    edge = device(state)
    assert_trained(send(edge, cfg, coordinator.request(1)))  # release 1
    coordinator.release(1)
    coordinator.release(2)
    assert_trained(send(edge, cfg, coordinator.request(3)))  # release 3: 2 apart
    coordinator.release(3)
    coordinator.release(4)
    assert_refused(
        send(edge, cfg, coordinator.request(5)),
        "2 participations already, max_participations = 2",
        "min_separation = 2",
    )
    restarted = device(state)  # a new process: the count is read from the state dir
    assert_refused(send(restarted, cfg, coordinator.request(5)), "2 participations already")
    kept = json.loads(next((state / "ftrl-participation").glob("*.json")).read_text())
    assert kept["releases"] == [1, 3]


def test_min_separation_is_clocked_by_the_signed_ledger(tmp_path):
    coordinator = Coordinator(tmp_path)
    cfg = coordinator.cfg
    edge = device(tmp_path / "state")
    assert_trained(send(edge, cfg, coordinator.request(1)))
    coordinator.release(1)
    # Release 2 is one after this device's release 1: too close.
    assert_refused(send(edge, cfg, coordinator.request(2)), "1 rounds after round 1")
    # The coordinator cannot renumber: a head claiming release 5 fails its hash/signature.
    env = coordinator.request(2)
    head = json.loads(env.config[WITNESS_CONFIG_KEY])
    forged = {**head["entry"], "round": 5}
    env.config[WITNESS_CONFIG_KEY] = json.dumps({**head, "entry": forged}, sort_keys=True)
    assert_refused(send(edge, cfg, env), "hash")
    # Re-hashed and signed by another key: refused too (the device pinned the ledger key).
    other = LedgerSigner.generate()
    forged["hash"] = entry_hash(forged)
    forged["signature"] = other.sign(signed_message(forged["hash"])).hex()
    env.config[WITNESS_CONFIG_KEY] = json.dumps({**head, "entry": forged}, sort_keys=True)
    assert_refused(send(edge, cfg, env), "signature does not verify")
    coordinator.release(2)
    assert_trained(send(edge, cfg, coordinator.request(3)))  # release 3: 2 after 1
