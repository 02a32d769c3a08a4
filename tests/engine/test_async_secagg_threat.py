"""Malicious-server secure aggregation in asynchronous groups (issue 21, with issue 16's
rules): each group of G runs the malicious-mode session (roster, signed adverts, a
co-signed survivor set), in simulation and on the wall clock; a group too small for the
threat model is refused before the run, naming server.group_size and the minimum; a
server that drops a group's members to isolate one client's update gets nothing; under
DP the groups follow the secret cohort key, not the public seed."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

import pytest

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp import Ledger
from fedveil.privacy.secagg import SecAggServer
from fedveil.privacy.secagg.identity_keys import DerivedIdentities
from fedveil.privacy.secagg.server import ServerPhase
from fedveil.privacy.secagg.wire import encode_members
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine import secagg_channel
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.device_scheduler import DeviceScheduler
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.sampling import cohort_commitment, committed_graph_seed
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.server.engine.unmask_gate import Aborted
from fedveil.simulations.inprocess import InProcessTransport


def config(tmp_path, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 3,
        "server.mode": "async",
        "server.buffer": 3,
        "server.group_size": 3,
        "secagg.enabled": True,
        "secagg.threat": "malicious",
        "out": str(tmp_path / "run"),
    }
    values.update(extra)
    return load_config(None, values)


class Stages:
    """Counts the secure-aggregation requests each dispatch's clients received, records
    which clients sent a reply per (dispatch, kind), and lets a test fail clients."""

    def __init__(self, inner: Transport, fail=None) -> None:
        self.inner, self.fail = inner, fail
        self.lock = threading.Lock()  # the in-process clients train one at a time
        self.asked: Counter[str] = Counter()
        self.replied: dict[tuple[int, str], set[int]] = {}
        self.refused: dict[tuple[int, str], dict[int, str]] = {}  # failures, with why

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        failed = {c for c in requests if self.fail and self.fail(c, requests)}
        live = {c: m for c, m in requests.items() if c not in failed}
        with self.lock:
            for message in requests.values():
                self.asked[message.kind] += 1
            replies = self.inner.exchange(live, timeout_s) if live else {}
        for cid in failed:
            replies[cid] = ClientFailure(cid, "dropped by the server")
        for cid, reply in replies.items():
            key = (requests[cid].round, requests[cid].kind)
            if isinstance(reply, Envelope):
                self.replied.setdefault(key, set()).add(cid)
            else:
                self.refused.setdefault(key, {})[cid] = reply.reason
        return replies

    def close(self) -> None:
        self.inner.close()


def engine_for(cfg, tmp_path, fail=None, wall=False):
    ids = DerivedIdentities()
    task = tiny_task.make(cfg)
    _, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl", ids.roster)
    # The clients hold the run's config, as in a run: async keeps their sessions by dispatch.
    stages = Stages(InProcessTransport(task, identities=ids, run_config=cfg), fail)
    scheduler = DeviceScheduler(cfg) if wall else BufferedScheduler(cfg)
    return RoundEngine(cfg, task, stages, channel=channel, scheduler=scheduler), stages


@pytest.mark.parametrize("wall", [False, True], ids=["simulated", "wall_clock"])
def test_malicious_mode_groups_run_the_cosigned_session_and_train(tmp_path, wall):
    engine, stages = engine_for(config(tmp_path), tmp_path, wall=wall)
    w0 = engine.weights.clone()
    engine.run()
    assert engine.round == 3 and all(r.cohort_aggregated == 3 for r in engine.history)
    aborted = [r.extra["aborted_groups"] for r in engine.history if r.extra.get("aborted_groups")]
    assert not aborted, (aborted, stages.refused)
    # Every applied group went through the consistency round (the co-signed survivor set).
    assert stages.asked["secagg.consistency"] >= 3 * 3
    assert (engine.weights - w0).abs().max() > 0


def test_a_group_too_small_for_the_threat_model_is_refused_naming_the_field(tmp_path):
    # Half the clients may be corrupt: a malicious-server group of 3 or 4 admits no
    # threshold (the server with the corrupt members could unmask a victim), 5 does.
    threat = {"secagg.adversarial_rate": 0.5}
    for g in (3, 4):
        cfg = config(tmp_path, **threat, **{"server.group_size": g})
        with pytest.raises(ConfigError, match=rf"server\.group_size = {g}: .* at least 5"):
            make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "l.jsonl", {})
    cfg = config(tmp_path, **threat, **{"server.group_size": 5, "server.buffer": 5})
    ids = DerivedIdentities()
    make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "l.jsonl", ids.roster)


class SkipsItsChecks(SecAggServer):
    """A malicious server: it sends the consistency round whatever the survivor count,
    skipping its own threshold and recoverability checks."""

    def _close_masked_input(self) -> None:
        round_ = self._round
        round_.u3 = self._close(ServerPhase.MASKED_INPUT)
        round_.survivors_bitmap = encode_members(round_.u3, self.session.ids_array)


def test_a_server_that_drops_members_to_isolate_one_update_gets_nothing(tmp_path, monkeypatch):
    # G = 5 with a fifth corrupt: t = 4. At masked input the server keeps the target and
    # one corrupt member and "drops" the other three (their inputs never reach the sum),
    # then skips its own check: the survivor set {target, corrupt} is below t.
    cfg = config(
        tmp_path,
        **{
            "secagg.adversarial_rate": 0.2,
            "server.group_size": 5,
            "server.buffer": 5,
            "server.per_round": 5,
            "server.rounds": 1,
        },
    )
    monkeypatch.setattr(secagg_channel, "SecAggServer", SkipsItsChecks)

    def isolate(cid: int, requests: Mapping[int, Envelope]) -> bool:
        message = requests[cid]
        if message.round != 1 or message.kind != "secagg.masked_input":
            return False
        return cid not in sorted(requests)[:2]

    engine, stages = engine_for(cfg, tmp_path, fail=isolate)
    engine.scheduler.fill()
    unit = engine.scheduler.in_flight[1]
    assert unit.computed and len(unit.clients) == 5
    assert stages.replied[(1, "secagg.masked_input")] == set(sorted(unit.clients)[:2])
    # Both kept members were shown a set of 2 < t = 4 and refused to sign it: no
    # signature, no unmask request, no share; the group is lost, never revealed.
    assert stages.asked["secagg.consistency"] == 2
    assert not stages.replied.get((1, "secagg.consistency"))
    refusals = stages.refused[(1, "secagg.consistency")]
    assert len(refusals) == 2
    assert all("too few survivors to unmask safely" in why for why in refusals.values())
    assert stages.asked["secagg.unmask"] == 0
    assert isinstance(unit.outcome, Aborted) and not unit.outcome.unmasked
    engine.scheduler.deliver(1)
    assert engine.scheduler.window.aborted_groups == 1 and not engine.scheduler.window.buffer


def dp_groups(tmp_path, name: str, **extra) -> tuple[dict[int, set[int]], RunStore, RoundEngine]:
    cfg = config(
        tmp_path / name,
        **{
            "secagg.threat": "semi_honest",
            "server.rounds": 2,
            "server.max_participations": 2,
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "dp.noise_multiplier": 2.0,
            "dp.clip": 0.5,
            **extra,
        },
    )
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    store.clear()
    with InProcessTransport(task) as inner:
        stages = Stages(inner)
        engine = RunLifecycle(cfg, task, store).engine(stages)
        assert isinstance(engine.scheduler, BufferedScheduler)
        engine.run()
    groups = {seq: ids for (seq, kind), ids in stages.replied.items() if kind.endswith("advertise")}
    return groups, store, engine


def test_under_dp_groups_follow_the_secret_key_not_the_public_seed(tmp_path):
    # Issue 16: two DP runs with one config and seed draw different groups (an observer
    # holding config.toml cannot recompute them); the key's commitment opens the ledger
    # and fixes every session's graph seed; dp.seeded_cohorts asks for the seed instead.
    a, store, engine = dp_groups(tmp_path, "a")
    b, _, _ = dp_groups(tmp_path, "b")
    assert len(a) >= 4 and a.keys() == b.keys() and a != b
    key = bytes.fromhex(store.run_identity()["cohort_key"])
    # The commitment opens the ledger: in its signed opening record (schema 3, issue 28).
    opening = Ledger(store.ledger_path).opening
    assert opening is not None and opening["cohort_commitment"] == cohort_commitment(key)
    channel = engine.channel
    assert isinstance(channel, secagg_channel.SecAggChannel) and channel.last_session
    last = channel.last_session.round
    assert channel.last_session.graph_seed == committed_graph_seed(key, last)
    seeded = {"dp.seeded_cohorts": True}
    assert dp_groups(tmp_path, "c", **seeded)[0] == dp_groups(tmp_path, "d", **seeded)[0]
