"""Malicious-server secure aggregation in the round engine: identities, roster, refusals."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.torch import load_file

import tiny_task
from fedveil.client.runtime import ClientRuntime
from fedveil.config import load_config
from fedveil.privacy.secagg import SIMULATION_RUN_ID, SessionConfig, ThreatModel, crypto
from fedveil.privacy.secagg import decode_message as decode
from fedveil.privacy.secagg.identity_files import DeviceIdentity, RosterFile
from fedveil.privacy.secagg.identity_keys import DerivedIdentities, Roster, public_bytes
from fedveil.privacy.secagg.messages import AdvertiseRequest
from fedveil.protocol.envelope import Envelope, MessageError
from fedveil.protocol.secagg_frame import protocol_part, wrap
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.simulate_run import simulate


def config(tmp_path, name="run", **overrides):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 8,
        "server.rounds": 3,
        "secagg.enabled": True,
        "secagg.threat": "malicious",
        "out": str(tmp_path / name),
    }
    values.update(overrides)
    return load_config(None, values)


class Recorder:
    """Counts exchanges per round and lets a test rewrite replies (a server in the middle)."""

    def __init__(self, inner, rewrite=None) -> None:
        self.inner, self.rewrite = inner, rewrite
        self.exchanges: Counter[int] = Counter()

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(self, requests, timeout_s, on_reply=None):
        self.exchanges[min(m.round for m in requests.values())] += 1
        replies = self.inner.exchange(requests, timeout_s)
        if self.rewrite is not None:
            for cid, reply in replies.items():
                replies[cid] = self.rewrite(cid, requests[cid], reply)
        return replies

    def close(self):
        self.inner.close()


def engine_run(cfg, server_roster, identities, rewrite=None, workers=1, rounds=None):
    task = tiny_task.make(cfg)
    privacy, channel = make_privacy_pipeline(cfg, task, cfg.out + "-ledger.jsonl", server_roster)
    with InProcessTransport(task, workers=workers, identities=identities) as inner:
        recorder = Recorder(inner, rewrite)
        engine = RoundEngine(cfg, task, recorder, channel=channel, privacy=privacy)
        records = [engine.run_round() for _ in range(rounds or cfg.server.rounds)]
    return records, recorder, channel


def max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.procs
def test_malicious_mode_gives_the_semi_honest_model_within_quantization_error(tmp_path):
    semi = config(tmp_path, "semi", **{"secagg.threat": "semi_honest"})
    mal = config(tmp_path, "mal", **{"simulation.workers": 2})
    simulate(semi)
    simulate(mal)
    a, b = load_file(f"{semi.out}/model.safetensors"), load_file(f"{mal.out}/model.safetensors")
    assert 0 < max_diff(a, b) < 1e-4


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.procs)])
def test_a_malicious_mode_round_adds_the_consistency_exchange(tmp_path, workers):
    cfg = config(tmp_path)
    ids = DerivedIdentities()
    records, recorder, channel = engine_run(cfg, ids.roster, ids, workers=workers)
    assert channel.last_session is not None and channel.last_session.malicious
    # Round 1: advertise, share keys, masked input, consistency, unmask; later rounds
    # start at masked input (their key stages rode on the previous round's exchanges).
    assert [recorder.exchanges[r] for r in (1, 2, 3)] == [5, 3, 3]
    assert all(r.applied and r.cohort_aggregated == 8 for r in records)
    # Each round's record says which protocol ran, with which parameters.
    k, t = channel.last_session.neighbors, channel.last_session.threshold
    assert 2 * t > k + 1
    assert all(
        r.extra
        == {**r.extra, "secagg_threat": "malicious", "secagg_neighbors": k, "secagg_threshold": t}
        for r in records
    )


def test_clients_missing_from_the_roster_are_left_out_by_name(tmp_path, caplog):
    cfg = config(tmp_path, **{"server.per_round": 12, "server.rounds": 2})
    ids = DerivedIdentities()
    listed = {cid: ids.public_key(cid) for cid in range(10)}
    records, recorder, _ = engine_run(cfg, listed, ids)
    for record in records:
        assert record.applied and record.cohort_aggregated == 10 and record.dropped == 2
        reasons = record.extra["drops_by_reason"]
        assert reasons == {"no identity key in the secure-aggregation roster": 2}
    assert "no identity key in the roster" in caplog.text
    # The listed clients' next round is still keyed early.
    assert [recorder.exchanges[r] for r in (1, 2)] == [5, 3]


def test_running_devices_take_the_operators_new_roster_without_a_restart(tmp_path):
    """The operator adds clients 10 and 11: a new roster file replaces the old one on the
    devices, which keep running, and on the coordinator, whose next submission reads it.
    Every device checks its neighbours against its own file, so without re-reading it the
    old devices would refuse the newcomers' advertisements and the round would fail."""
    ids = DerivedIdentities()
    path = tmp_path / "roster.json"

    def publish(n: int) -> dict[int, bytes]:
        listed = {cid: ids.public_key(cid) for cid in range(n)}
        (tmp_path / "roster.new").write_text(Roster(listed).to_json())
        os.replace(tmp_path / "roster.new", path)
        return listed

    def start(cid: int) -> DeviceIdentity:
        owner = (cid, ids.public_key(cid))
        return DeviceIdentity(cid, ids.private_key(cid), RosterFile(path, owner=owner))

    listed = publish(10)
    devices = {cid: start(cid) for cid in range(10)}
    overrides = {"server.per_round": 12, "server.rounds": 1}
    (before,), _, _ = engine_run(config(tmp_path, "before", **overrides), listed, devices.get)
    assert before.applied and before.cohort_aggregated == 10 and before.dropped == 2

    listed = publish(12)
    devices.update({cid: start(cid) for cid in (10, 11)})  # the new devices start
    (after,), _, _ = engine_run(config(tmp_path, "after", **overrides), listed, devices.get)
    assert after.applied and after.cohort_aggregated == 12 and after.dropped == 0
    assert all(len(devices[cid].roster) == 12 for cid in range(10))


def test_a_server_that_swaps_a_clients_identity_key_gets_nothing(tmp_path):
    """The coordinator lists its own key for client 3 and re-signs 3's advertisement with
    it: its own check passes, but every neighbour of 3 checks against its own roster and
    aborts, so no masked input is ever sent."""
    cfg = config(tmp_path, **{"server.per_round": 12, "server.rounds": 1})
    ids = DerivedIdentities()
    forger = Ed25519PrivateKey.generate()
    server_roster = {cid: ids.public_key(cid) for cid in range(12)}
    server_roster[3] = public_bytes(forger)
    masked_inputs: list[int] = []

    def rewrite(cid, request, reply):
        if request.kind == "secagg.masked_input" and isinstance(reply, Envelope):
            masked_inputs.append(cid)
        if cid != 3 or request.kind != "secagg.advertise" or not isinstance(reply, Envelope):
            return reply
        advert = decode(*protocol_part(reply))
        session = decode(*protocol_part(request)).session
        transcript = crypto.advert_transcript(
            session.digest,
            3,
            advert.mask_public_key,
            advert.encryption_public_key,
            advert.seed_commitment,
        )
        forged = dataclasses.replace(advert, signature=crypto.sign(forger, transcript))
        return wrap(reply.kind, reply.round, forged)

    (record,), _, _ = engine_run(cfg, server_roster, ids, rewrite=rewrite)
    assert not record.applied
    assert masked_inputs == []  # nobody masked an update under the forged key


def session(threat: str) -> SessionConfig:
    return SessionConfig.create(
        range(5),
        dimension=4,
        modulus_bits=16,
        run_id=SIMULATION_RUN_ID,
        round=1,
        threat=ThreatModel(0.0, 0.1, threat),
    )


def advertise(threat: str) -> Envelope:
    s = session(threat)
    return wrap("secagg.advertise", 1, AdvertiseRequest(s.session_id, 2, s))


def runtime(tmp_path, identities):
    cfg = config(tmp_path)
    return ClientRuntime(tiny_task.make(cfg), identities=identities)


def test_a_device_with_an_identity_refuses_a_semi_honest_session(tmp_path):
    ids = DerivedIdentities()
    rt = runtime(tmp_path, ids)
    with pytest.raises(MessageError, match="threat_mode = 'semi_honest'"):
        rt.handle_one(2, advertise("semi_honest"), {})
    reply = rt.handle_one(2, advertise("malicious"), {})
    assert len(decode(*protocol_part(reply)).signature) == 64


def test_a_client_without_an_identity_refuses_malicious_mode_by_name(tmp_path):
    rt = runtime(tmp_path, None)
    with pytest.raises(MessageError, match="--identity-key"):
        rt.handle_one(2, advertise("malicious"), {})
    assert isinstance(rt.handle_one(2, advertise("semi_honest"), {}), Envelope)


def test_an_identity_answers_only_for_its_own_client(tmp_path):
    ids = DerivedIdentities()
    rt = runtime(tmp_path, lambda _cid: ids.identity(1))
    with pytest.raises(MessageError, match="client 1's"):
        rt.handle_one(2, advertise("malicious"), {})


def test_without_a_roster_the_pipeline_refuses_malicious_mode(tmp_path):
    cfg = config(tmp_path)
    with pytest.raises(ValueError, match="identity roster"):
        make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "ledger.jsonl")


def test_derived_identities_rebuild_the_same_keys_from_their_pickle():
    import pickle

    ids = DerivedIdentities()
    copy = pickle.loads(pickle.dumps(ids))
    assert copy.public_key(7) == ids.public_key(7) != ids.public_key(8)
    assert copy.roster[3] == public_bytes(ids.private_key(3))
    assert repr(ids) == "DerivedIdentities(<secret>)"
