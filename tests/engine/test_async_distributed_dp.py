"""Distributed DP under asynchronous training (issue 21): every secure-aggregation group is
one release, noised by the Skellam shares its members add, charged in the signed ledger
before any unmasking request, and refused below the group's survivor floor by the server
and by every member; each client is in at most server.max_participations releases, so its
epsilon is the P-fold composition stated before the run. The tests play the adversary: a
server that skips its survivor check, or changes the group's plan; a crash between a
group's charge and the checkpoint; and the auditor recomputing the bound."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

import numpy as np
import pytest
from test_async_secagg_threat import Stages

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp import Ledger, SkellamParams
from fedveil.privacy.dp.accounting import compute_epsilon, individual_epsilon
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.privacy.dp.report import headline_lines
from fedveil.privacy.dp.subsampled_rdp import DEFAULT_ORDERS, rdp_to_epsilon
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.privacy.encodings import SkellamEncoding
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.device_scheduler import DeviceScheduler
from fedveil.server.engine.distributed_release import AsyncDistributedDP
from fedveil.server.engine.dp_from_config import plan_distributed_dp
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.privacy_report import write_privacy_report
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.secagg_channel import SecAggChannel
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.server.engine.unmask_gate import Aborted
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport

CAP = 2
DELTA = 1e-5


def config(out, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 4,
        "server.mode": "async",
        "server.buffer": 3,
        "server.group_size": 3,
        "server.max_participations": CAP,
        "secagg.enabled": True,
        "dp.mechanism": "distributed",
        "dp.epsilon": 8.0,
        "dp.clip": 0.5,
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "out": str(out),
    }
    values.update(extra)
    return load_config(None, values)


def run(cfg, *, resume=False, wrap=None, on_round=None) -> tuple[RoundEngine, RunStore]:
    """A whole run as `fedveil simulate` makes it: its clients hold the run config (and so
    compute the group plan themselves)."""
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    if not resume:
        store.clear()
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task, run_config=cfg) as transport:
        outer = transport if wrap is None else wrap(transport)
        engine = life.engine(
            outer, resume=resume, availability=AvailabilityModel.from_config(cfg), on_round=on_round
        )
        assert isinstance(engine.scheduler, BufferedScheduler) and isinstance(
            engine.privacy, AsyncDistributedDP
        )
        engine.run()
    return engine, store


class ChargedFirst(Stages):
    """Checks, at every unmasking request, that the group's ledger entry is already on
    disk (signed) and the private annex names this group's survivors as charged."""

    def __init__(self, inner: Transport, store: RunStore) -> None:
        super().__init__(inner)
        self.store = store
        self.unmasked: list[int] = []

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        unmasking = {m.round for m in requests.values() if m.kind == "secagg.unmask"}
        for seq in sorted(unmasking):
            self.unmasked.append(seq)
            releases = Ledger(self.store.ledger_path).releases
            charges = [r for r in self.store.read_private() if r.get("kind") == "charge"]
            assert len(releases) == len(self.unmasked) == len(charges)
            assert (
                charges[-1]["dispatch"] == seq and charges[-1]["ledger_seq"] == releases[-1]["seq"]
            )
            assert releases[-1]["signature"]
        return super().exchange(requests, timeout_s)


def test_every_group_is_charged_before_its_unmasking_and_the_bound_is_the_p_fold_composition(
    tmp_path,
):
    cfg = config(tmp_path / "run")
    watchers: list[ChargedFirst] = []
    store = RunStore(cfg.out)
    engine, store = run(cfg, wrap=lambda t: watchers.append(ChargedFirst(t, store)) or watchers[-1])
    assert engine.round == 4 and watchers[0].unmasked
    releases = Ledger(store.ledger_path).releases
    assert len(releases) == len(watchers[0].unmasked) > CAP  # the cap is what bounds epsilon

    # The auditor: every release's z from its recorded Skellam parameters at the plan's
    # fewest honest shares, composed P times at q = 1 (nothing sampled, no amplification).
    plan = engine.privacy.plan
    assert plan is not None
    for entry in releases:
        params = SkellamParams.from_dict(entry["skellam"])
        assert entry["noise_shares"] == plan.min_honest
        assert params.noise_multiplier_for(plan.min_honest, "zero_out") == pytest.approx(
            entry["noise_multiplier"], rel=1e-12
        )
        assert (entry["sampling_rate"], entry["max_participations"]) == (1.0, CAP)
        assert entry["accountant"] == "skellam_rdp_integer"
    z = plan.noise_multiplier
    composed = compute_epsilon(
        [PrivacyEvent(z, 1.0, steps=CAP, neighbouring="zero_out")], DELTA, "skellam_rdp_integer"
    )
    orders = np.asarray(DEFAULT_ORDERS)
    gaussian = rdp_to_epsilon(orders, CAP * orders / (2 * z**2), DELTA)  # the Skellam curve
    assert composed == pytest.approx(gaussian, rel=1e-12)
    result = verify_ledger(store.ledger_path)
    assert result.ok, result.message
    assert result.final_epsilon == pytest.approx(composed, rel=1e-12)
    assert engine.privacy.bound == pytest.approx(composed, rel=1e-12) and composed <= 8.0
    # The coordinator's figure is the same unamplified bound, stated from the ledger alone.
    closing = Ledger(store.ledger_path).entries[-1]
    assert closing["epsilon_coordinator_bound"] == pytest.approx(composed, rel=1e-12)
    assert individual_epsilon([PrivacyEvent(z, 1.0, neighbouring="zero_out")] * CAP, DELTA) == (
        pytest.approx(composed, rel=1e-12)
    )
    # No client is in more releases than the cap: the private annex says who each charged.
    charged = Counter(
        c for r in store.read_private() if r.get("kind") == "charge" for c in r["survivors"]
    )
    assert max(charged.values()) <= CAP


def test_the_reports_state_each_adversary_and_no_counts(tmp_path):
    from fedveil.cli.main import main

    engine, store = run(config(tmp_path / "run"))
    report = write_privacy_report(store.path, engine.privacy.config)
    bound = engine.privacy.bound
    assert report["epsilon"] == pytest.approx(bound)
    assert report["participation"]["epsilon_cap_bound"] == pytest.approx(bound)
    assert report["adversaries"]["observers"]["amplified_by_sampling"] is False
    coordinator = report["adversaries"]["coordinator"]
    assert coordinator["epsilon_bound"] == pytest.approx(bound)
    assert f"a client in {CAP} releases" in coordinator["bound"]
    said = f"for any client (a client in {CAP} releases"  # not "in every round"
    assert any(said in line for line in headline_lines(report))
    assert said in (store.path / "privacy" / "report.html").read_text()
    assert "coordinator" in report["adversaries"]["cohort_members"]["bound"]
    public = (store.path / "privacy" / "report.json").read_text()
    for private_key in ('"survivors"', "dispatches_max", '"dispatch"', "epsilon_client_max"):
        assert private_key not in public
    for line in store.metrics_path.read_text().splitlines():
        record = json.loads(line)
        assert record["epsilon_coordinator_bound"] == pytest.approx(record["epsilon"])
        assert not {"cohort_aggregated", "dropped", "applied_dispatches"} & set(record)
    assert main(["privacy", "verify", str(store.path)]) == 0


class SkipsItsSurvivorCheck:
    """A server's unmask gate that checks nothing and charges nothing."""

    def __init__(self) -> None:
        self.called = 0

    def before_unmask(self, round_num: int, survivors: frozenset[int]) -> None:
        self.called += 1


def one_group(tmp_path, gate_of=None, encoding_of=None, drop=True):
    """One group of 6 (floor 5 survivors, 4 honest shares) whose server drops two members
    at masked input (unless not `drop`): 4 survivors, above the protocol's threshold
    t = 2, below the floor."""
    cfg = config(
        tmp_path / "run",
        **{"server.group_size": 6, "server.buffer": 3, "server.rounds": 1},
    )
    task = tiny_task.make(cfg)
    stage, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    assert isinstance(stage, AsyncDistributedDP) and stage.plan is not None
    assert (stage.plan.min_survivors, stage.plan.min_honest) == (5, 4)
    if gate_of is not None or encoding_of is not None:
        encoding = SkellamEncoding(stage.plan.params if encoding_of is None else encoding_of(stage))
        gate = stage if gate_of is None else gate_of(stage)
        channel = SecAggChannel(cfg.secagg, encoding, gate=gate, quiet_counts=True)

    def drop_two(cid: int, requests: Mapping[int, Envelope]) -> bool:
        masked = requests[cid].kind == "secagg.masked_input"
        return drop and masked and cid in sorted(requests)[:2]

    stages = Stages(InProcessTransport(task, run_config=cfg), drop_two)
    engine = RoundEngine(
        cfg, task, stages, channel=channel, privacy=stage, scheduler=BufferedScheduler(cfg)
    )
    engine.scheduler.fill()
    unit = engine.scheduler.in_flight[1]
    assert unit.computed and len(unit.clients) == 6
    return stage, stages, unit


def test_the_gate_refuses_a_group_below_its_survivor_floor_and_charges_nothing(tmp_path):
    _, stages, unit = one_group(tmp_path)
    assert len(stages.replied[(1, "secagg.masked_input")]) == 4
    assert isinstance(unit.outcome, Aborted) and not unit.outcome.unmasked
    assert "4 survivors < 5" in unit.outcome.reason
    assert stages.asked["secagg.unmask"] == 0
    assert not Ledger(tmp_path / "ledger.jsonl").releases  # lost, never revealed, uncharged


def test_a_server_that_skips_its_survivor_check_gets_no_shares(tmp_path):
    gate = SkipsItsSurvivorCheck()
    _, stages, unit = one_group(tmp_path, gate_of=lambda _: gate)
    assert gate.called == 1 and stages.asked["secagg.unmask"] == 4
    # Every member holds the group's plan: 4 survivors < its floor of 5, no share revealed.
    assert not stages.replied.get((1, "secagg.unmask"))
    refusals = stages.refused[(1, "secagg.unmask")]
    assert len(refusals) == 4
    assert all("4 survivors < 5" in why and "no share revealed" in why for why in refusals.values())
    assert isinstance(unit.outcome, Aborted)  # nothing could be reconstructed


def test_a_member_refuses_a_server_that_changes_the_group_plan(tmp_path):
    # Half the noise: the shares sized for twice the honest members the plan guarantees.
    def thinner(stage: AsyncDistributedDP) -> SkellamParams:
        plan = stage.plan
        assert plan is not None
        return SkellamParams.calibrate(
            dim=plan.params.dim,
            clip_norm=plan.params.clip_norm,
            noise_multiplier=plan.params.noise_multiplier,
            num_clients=plan.params.num_clients,
            min_clients=plan.params.num_clients,
            bits=plan.params.bits,
        )

    _, stages, unit = one_group(tmp_path, encoding_of=thinner, drop=False)
    refusals = stages.refused[(1, "secagg.masked_input")]
    assert len(refusals) == 6 and not stages.replied.get((1, "secagg.masked_input"))
    assert all("differ from this client's" in why for why in refusals.values())
    assert isinstance(unit.outcome, Aborted) and stages.asked["secagg.unmask"] == 0


def advertised_groups(tmp_path, name: str, **extra) -> dict[int, set[int]]:
    recorders: list[Stages] = []
    run(
        config(tmp_path / name, **extra),
        wrap=lambda t: recorders.append(Stages(t)) or recorders[-1],
    )
    replied = recorders[0].replied.items()
    return {seq: ids for (seq, kind), ids in replied if kind == "secagg.advertise"}


def test_two_runs_draw_different_groups_from_their_secret_keys(tmp_path):
    a, b = advertised_groups(tmp_path, "a"), advertised_groups(tmp_path, "b")
    # Other members mean other latencies, so the runs may dispatch different numbers of
    # groups (members are freed as they finish training); compare the ones both made.
    both = sorted(a.keys() & b.keys())
    assert len(both) >= 4 and [a[s] for s in both] != [b[s] for s in both]
    seeded = {"dp.seeded_cohorts": True}
    assert advertised_groups(tmp_path, "c", **seeded) == advertised_groups(tmp_path, "d", **seeded)


def test_a_crash_after_groups_were_charged_resumes_within_the_cap_and_applies_none_twice(
    tmp_path,
):
    # 18 clients at a cap of 3: 54 dispatches, room for the 5 versions' groups, the
    # groups charged and lost to the crash, and the units recomputed at each resume. With
    # 12 (36 dispatches) the secret draws sometimes left fewer than a group's 3 eligible
    # clients before version 5, and the run ended at 4 (1-2 in 25, on the old engine too).
    cfg = config(
        tmp_path / "run",
        **{"server.rounds": 5, "server.max_participations": 3, "data.num_clients": 18},
    )

    class Stop(Exception):
        pass

    def stop_at(n: int):
        def on_round(record) -> None:
            if record.round == n:
                raise Stop(n)  # after the version's checkpoint

        return on_round

    with pytest.raises(Stop):
        run(cfg, on_round=stop_at(2))
    store = RunStore(cfg.out)
    saved = store.checkpoint_path.read_bytes()
    charged_at_2 = len(Ledger(store.ledger_path).releases)
    with pytest.raises(Stop):
        run(cfg, resume=True, on_round=stop_at(3))
    # Version 3's checkpoint never landed: the groups charged since (unmasked when they
    # were dispatched) stay charged, and the units in flight are recomputed as new
    # dispatches of their members.
    store.checkpoint_path.write_bytes(saved)
    assert len(Ledger(store.ledger_path).releases) > charged_at_2
    engine, _ = run(cfg, resume=True)
    assert engine.round == 5
    result = verify_ledger(store.ledger_path)
    assert result.ok, result.message
    assert result.final_epsilon == pytest.approx(engine.privacy.bound)
    private = store.read_private()
    dispatches = Counter(r["client"] for r in private if r.get("kind") == "dispatch")
    charged = Counter(c for r in private if r.get("kind") == "charge" for c in r["survivors"])
    assert max(dispatches.values()) <= 3 and max(charged.values()) <= 3
    assert all(charged[c] <= dispatches[c] for c in charged)
    applied = [s for r in private if r.get("status") == "applied" for s in r["applied_dispatches"]]
    assert len(applied) == len(set(applied))
    assert sorted(r["round"] for r in private if "applied_dispatches" in r) == [1, 2, 3, 4, 5]


def test_what_cannot_be_accounted_or_afforded_is_refused_naming_the_field(tmp_path):
    def pipeline(**extra):
        cfg = config(tmp_path / "r", **extra)
        return make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "l.jsonl")

    with pytest.raises(ConfigError, match=r"needs a cap: server\.max_participations = 0"):
        config(tmp_path, **{"server.max_participations": 0})
    with pytest.raises(ConfigError, match=r"server\.max_participations = 40: a client in 40 "):
        pipeline(**{"server.max_participations": 40, "dp.noise_multiplier": 0.8})
    with pytest.raises(
        ConfigError, match=r"secagg\.adversarial_rate = 0\.5: .*server\.group_size = 3.*"
    ):
        pipeline(**{"secagg.adversarial_rate": 0.5})
    with pytest.raises(ConfigError, match=r"dp\.accountant = 'rdp'"):
        config(tmp_path, **{"dp.accountant": "rdp"})
    with pytest.raises(ConfigError, match=r"dp\.neighbouring = 'add_remove'"):
        config(tmp_path, **{"dp.neighbouring": "add_remove"})
    # On devices the groups' sessions run at once: refused there, saying why.
    cfg = config(tmp_path / "w")
    task = tiny_task.make(cfg)
    with pytest.raises(ConfigError, match=r"dp\.mechanism = 'distributed'.*on devices"):
        RoundEngine(
            cfg, task, InProcessTransport(task, run_config=cfg), scheduler=DeviceScheduler(cfg)
        )


def test_the_member_computes_the_servers_group_plan(tmp_path):
    from fedveil.client.runtime import ClientRuntime

    cfg = config(tmp_path / "run", **{"server.group_size": 6})
    task = tiny_task.make(cfg)
    stage, _ = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    assert isinstance(stage, AsyncDistributedDP)
    held = ClientRuntime(task, run_config=cfg).distributed_dp_plan()
    assert held == stage.plan and held.params.num_clients == 6
    # Not the sync plan of the same population: the group is the cohort, z the cap's.
    sync = config(tmp_path / "sync", **{"server.mode": "sync", "server.max_participations": 0})
    assert plan_distributed_dp(sync, held.params.dim, 12) != held
