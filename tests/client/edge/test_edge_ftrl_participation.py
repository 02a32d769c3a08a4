"""A device keeps its side of DP-FTRL's participation schema (issue 35).

Requests go through the device's own message path (`answer`: a Flower Message in, a
Message out), built by the real DP-FTRL stage with its signed ledger: the device counts
its participations in its state directory (a restart keeps them) and clocks the
separation by the release index of the signed ledger head it verified.
"""

from __future__ import annotations

import json

import pytest
from signed_requests import (
    SignedCoordinator,
    assert_refused,
    assert_trained,
    device,
    model_weights,
    use_flower_run,
)
from signed_requests import send as send_to

from fedveil.client.edge.device_app import edge_from_node_config
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


def isolated_device(state):
    """The device as Flower's process isolation builds it (node config `state-dir`): a
    new call is the app's process restarted."""
    return edge_from_node_config(
        {"client-id": 0, "task": "deploy_task:make", "state-dir": str(state)}
    )


def test_a_device_under_process_isolation_keeps_its_participations_over_a_restart(tmp_path):
    coordinator = ftrl_coordinator(tmp_path)
    cfg, state = coordinator.cfg, tmp_path / "state"
    assert_trained(send(isolated_device(state), cfg, coordinator.request(1)))
    coordinator.release(1)
    coordinator.release(2)
    assert_trained(send(isolated_device(state), cfg, coordinator.request(3)))
    coordinator.release(3)
    coordinator.release(4)
    kept = state / "ftrl-participation" / "ftrl-run-0.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert json.loads(kept.read_text())["releases"] == [1, 3]
    assert_refused(
        send(isolated_device(state), cfg, coordinator.request(5)), "2 participations already"
    )


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"run_id": "ftrl-run", "client_id": 0, "releases": ["1"]}',
        b'{"run_id": "ftrl-run", "client_id": 0, "releases": [0]}',
        b'{"run_id": "ftrl-run", "client_id": 0}',
        b'{"run_id": "another-run", "client_id": 0, "releases": []}',
        b'{"run_id": "ftrl-run", "client_id": 1, "releases": []}',
    ],
    ids=["not-json", "string", "zero", "missing", "another-run", "another-client"],
)
def test_a_participation_record_it_cannot_trust_is_a_refusal_naming_it(tmp_path, content):
    """A corrupt or foreign record is not an empty history (which would reopen the
    schema): the request is refused, naming the file."""
    coordinator = ftrl_coordinator(tmp_path)
    state = tmp_path / "state"
    bad = state / "ftrl-participation" / "ftrl-run-0.json"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(content)
    assert_refused(send(device(state), coordinator.cfg, coordinator.request(1)), str(bad))


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


def test_a_link_in_place_of_the_participation_record_is_refused(tmp_path):
    """A record is read without following a link: a link to a record of the planter's
    choosing (here an empty history) is refused, naming the file."""
    coordinator = ftrl_coordinator(tmp_path)
    state = tmp_path / "state"
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text('{"run_id": "ftrl-run", "client_id": 0, "releases": []}')
    link = state / "ftrl-participation" / "ftrl-run-0.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    assert_refused(send(device(state), coordinator.cfg, coordinator.request(1)), str(link))
