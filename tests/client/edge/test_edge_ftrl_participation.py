"""A device keeps its side of DP-FTRL's participation schema (issue 35).

Requests go through the device's own message path (`answer`: a Flower Message in, a
Message out), built by the real DP-FTRL stage with its signed ledger: the device counts
its participations in its state directory (a restart keeps them) and clocks the
separation by the release index of the signed ledger head it verified.
"""

from __future__ import annotations

import json

from signed_requests import (
    SignedCoordinator,
    assert_refused,
    assert_trained,
    device,
    model_weights,
    use_flower_run,
)
from signed_requests import send as send_to

from fedveil.config import load_config
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY, entry_hash, signed_message
from fedveil.privacy.dp.signing import LedgerSigner
from fedveil.server.engine.ftrl_stage import FtrlDP

N = 5
FLOWER_RUN = 78
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
    use_flower_run(FLOWER_RUN)


def ftrl_coordinator(tmp_path) -> SignedCoordinator:
    """The real DP-FTRL stage with its signed ledger, and its requests."""
    cfg = load_config(None, FTRL)
    stage = FtrlDP(
        cfg,
        N,
        tmp_path / "ledger.jsonl",
        model_size=model_weights().numel(),
        run_id="ftrl-run",
        signer=LedgerSigner.generate(),
    )
    return SignedCoordinator(cfg, stage)


def send(edge, cfg, env):
    return send_to(edge, cfg, env, FLOWER_RUN)


def test_at_most_k_participations_also_after_a_restart(tmp_path):
    coordinator = ftrl_coordinator(tmp_path)
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
    coordinator = ftrl_coordinator(tmp_path)
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
