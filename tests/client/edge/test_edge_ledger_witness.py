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
from signed_requests import (
    SETUP,
    SignedCoordinator,
    assert_refused,
    assert_trained,
    device,
    use_flower_run,
)
from signed_requests import send as send_to

from fedveil.config import load_config
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY, entry_hash, signed_message
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.privacy.dp.verify import read_witness_file, verify_ledger
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.central_release import CentralDP
from fedveil.server.engine.requests import build_train_request

N = 5
FLOWER_RUN = 77
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
    use_flower_run(FLOWER_RUN)


def config(**extra):
    return load_config(None, {**CENTRAL, **extra})


def central_coordinator(tmp_path, cfg, signer=None, name="ledger.jsonl") -> SignedCoordinator:
    """A coordinator's central-DP stage with its signed ledger, and its requests."""
    stage = CentralDP(
        cfg, N, tmp_path / name, run_id="run-1", signer=signer or LedgerSigner.generate()
    )
    return SignedCoordinator(cfg, stage)


def send(edge, cfg, env):
    return send_to(edge, cfg, env, FLOWER_RUN)


def with_head(env, head):
    env.config[WITNESS_CONFIG_KEY] = json.dumps(head, sort_keys=True)
    return env


def test_an_honest_run_is_pinned_witnessed_and_verifiable(tmp_path, caplog):
    cfg = config()
    coordinator = central_coordinator(tmp_path, cfg)
    opening = coordinator.stage.ledger.opening
    assert opening is not None and opening["seq"] == 1, "opened before round 1"
    edge = device(tmp_path / "state")
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
    coordinator = central_coordinator(tmp_path, cfg)
    edge = device()
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
    coordinator = central_coordinator(tmp_path, config())  # builds the request's model only
    env = build_train_request(cfg, 1, coordinator.weights, None)
    env.config.update(SETUP)
    assert_refused(send(device(), cfg, env), "no ledger.head")


def test_a_forged_head_is_refused(tmp_path):
    cfg = config()
    coordinator = central_coordinator(tmp_path, cfg)
    edge = device()
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
    coordinator = central_coordinator(tmp_path, cfg)
    state = tmp_path / "state"
    edge = device(state)
    old = coordinator.request(2)  # the head at seq 1 (the opening)
    for round_num in (1, 2):
        assert_trained(send(edge, cfg, coordinator.request(round_num)))
        coordinator.release(round_num)
    assert_refused(send(edge, cfg, old), "rolled back")
    # A restarted device keeps its pin and the highest seq it saw.
    restarted = device(state)
    assert_refused(send(restarted, cfg, old), "rolled back")
    assert_trained(send(restarted, cfg, coordinator.request(3)))


def test_a_switched_key_or_restarted_ledger_is_refused(tmp_path):
    cfg = config()
    coordinator = central_coordinator(tmp_path, cfg)
    edge = device()
    assert_trained(send(edge, cfg, coordinator.request(1)))
    coordinator.release(1)
    # The coordinator starts a second ledger for the same run, under a new key.
    switched = central_coordinator(tmp_path, cfg, name="second.jsonl")
    assert_refused(send(edge, cfg, switched.request(2)), "changed key")
    # Or keeps the key's id but opens a second chain: not the pinned opening either.
    again = central_coordinator(
        tmp_path, cfg, signer=coordinator.stage.ledger.signer, name="third.jsonl"
    )
    assert_refused(send(edge, cfg, again.request(2)), "pinned run")
    assert_trained(send(edge, cfg, coordinator.request(2)))
