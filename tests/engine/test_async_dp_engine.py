"""Central DP under asynchronous training, end to end (issue 21): the engine never
dispatches a client past server.max_participations, every release has its signed
ledger entry before the model moves, the public files show the cap-based bound and no
counts, a crash between ledger and checkpoint stays charged, and what cannot be
accounted is refused before the run."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

import pytest

import tiny_task
from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp import Ledger
from fedveil.privacy.dp.participation import ParticipationCapError, cap_bound
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.buffered_scheduler import BufferedScheduler
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.privacy_report import write_privacy_report
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport

CAP = 2


def dp_config(out, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 6,
        "server.mode": "async",
        "server.buffer": 2,
        "server.max_participations": CAP,
        "simulation.latency_median": 1.0,
        "simulation.latency_sigma": 1.0,
        "dp.mechanism": "central",
        "dp.epsilon": 8.0,
        "dp.noise_multiplier": 2.0,
        "dp.clip": 0.5,
        "out": str(out),
    }
    values.update(extra)
    return load_config(None, values)


class Counting:
    """Counts every training request per client: what a client actually received."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.trained: Counter[int] = Counter()

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        for cid, request in requests.items():
            if request.kind == "train":
                self.trained[cid] += 1
        return self.inner.exchange(requests, timeout_s)

    def close(self) -> None:
        self.inner.close()


def run(cfg, *, resume=False, wrap=None, on_round=None) -> tuple[RoundEngine, RunStore]:
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    if not resume:
        store.clear()
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        outer = transport if wrap is None else wrap(transport)
        engine = life.engine(
            outer,
            resume=resume,
            availability=AvailabilityModel.from_config(cfg),
            on_round=on_round,
        )
        assert isinstance(engine.scheduler, BufferedScheduler)
        engine.run()
    return engine, store


def test_a_dp_run_charges_every_release_before_the_model_moves(tmp_path):
    cfg = dp_config(tmp_path / "run")
    seen: list[tuple[int, int]] = []
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    store.clear()
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        engine = life.engine(transport, availability=AvailabilityModel.from_config(cfg))
        step = engine.optimizer.step

        def watched_step(weights, update):
            # The model is about to move: its release must already be on disk.
            on_disk = Ledger(store.ledger_path).releases
            seen.append((engine.round + 1, int(on_disk[-1]["training_round"])))
            return step(weights, update)

        engine.optimizer.step = watched_step
        engine.run()
    assert seen == [(v, v) for v in range(1, 7)]
    result = verify_ledger(store.ledger_path)
    assert result.ok, result.message
    bound = cap_bound(engine.privacy.config.round_event(), CAP, 1e-5, "rdp")
    assert result.final_epsilon == pytest.approx(bound)
    releases = Ledger(store.ledger_path).releases
    assert {e["max_participations"] for e in releases} == {CAP}
    assert {e["sampling_rate"] for e in releases} == {1.0}


def test_no_client_is_ever_dispatched_past_its_cap(tmp_path):
    # 12 clients x 1 dispatch for 6 updates of 2, with dropouts: the cap runs out first.
    cfg = dp_config(tmp_path / "run", **{"server.max_participations": 1, "simulation.dropout": 0.3})
    counting: list[Counting] = []
    engine, store = run(cfg, wrap=lambda t: counting.append(Counting(t)) or counting[-1])
    assert max(counting[0].trained.values()) == 1
    assert "server.max_participations = 1" in (engine.stopped_reason or "")
    # The engine itself refuses a further dispatch, whoever asks.
    client = next(iter(counting[0].trained))
    with pytest.raises(ParticipationCapError):
        engine.privacy.dispatch(client, engine.round)
    assert verify_ledger(store.ledger_path).ok  # a run cut short by the cap still ends final


def test_the_public_files_show_the_bound_not_counts(tmp_path):
    cfg = dp_config(tmp_path / "run", **{"simulation.dropout": 0.2})
    engine, store = run(cfg)
    public = [json.loads(line) for line in store.metrics_path.read_text().splitlines()]
    assert public and all(set(r) >= {"round", "epsilon"} for r in public)
    for record in public:
        for key in (
            "cohort_aggregated",
            "dropped",
            "staleness",
            "applied_dispatches",
            "train_loss",
        ):
            assert key not in record
    summary = engine.summary(0.0)
    assert summary["max_participations"] == CAP
    for key in ("dispatched", "updates_applied", "stale_dropped", "dropped_total"):
        assert key not in summary
    private = store.read_private()
    dispatches = Counter(r["client"] for r in private if r.get("kind") == "dispatch")
    assert dispatches and max(dispatches.values()) <= CAP
    close = [r for r in private if r.get("kind") == "close"]
    assert close and close[-1]["epsilon_client_max_realised"] <= summary["epsilon"] + 1e-12
    report = write_privacy_report(store.path, engine.privacy.config)
    assert report["participation"]["max_participations"] == CAP
    assert report["epsilon"] == pytest.approx(report["participation"]["epsilon_cap_bound"])
    public_report = (store.path / "privacy" / "report.json").read_text()
    for private_key in ("dispatches_max", "epsilon_client_max_realised", '"client"'):
        assert private_key not in public_report


def test_a_crash_between_ledger_and_checkpoint_stays_charged_and_within_the_cap(tmp_path):
    cfg = dp_config(tmp_path / "run", **{"server.max_participations": 3})

    class Stop(Exception):
        pass

    def stop_at(n: int):
        def on_round(record) -> None:
            if record.round == n:
                raise Stop(n)  # after the round's ledger entry and checkpoint

        return on_round

    with pytest.raises(Stop):
        run(cfg, on_round=stop_at(2))
    store = RunStore(cfg.out)
    saved = store.checkpoint_path.read_bytes()
    with pytest.raises(Stop):
        run(cfg, resume=True, on_round=stop_at(3))
    store.checkpoint_path.write_bytes(saved)  # version 3's checkpoint never landed
    counting: list[Counting] = []
    engine, _ = run(cfg, resume=True, wrap=lambda t: counting.append(Counting(t)) or counting[-1])
    releases = Ledger(store.ledger_path).releases
    assert [e["training_round"] for e in releases] == [1, 2, 3, 4, 5, 6]  # the lost one stays
    assert engine.round == 6
    assert verify_ledger(store.ledger_path).ok
    dispatches = Counter(r["client"] for r in store.read_private() if r.get("kind") == "dispatch")
    assert max(dispatches.values()) <= 3


def test_what_cannot_be_accounted_is_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match=r"needs a cap: server\.max_participations = 0"):
        dp_config(tmp_path, **{"server.max_participations": 0})
    greedy = dp_config(tmp_path, **{"server.max_participations": 40, "dp.noise_multiplier": 0.8})
    with pytest.raises(ConfigError, match=r"server\.max_participations = 40.*> dp\.epsilon = 8"):
        make_privacy_pipeline(greedy, tiny_task.make(greedy), tmp_path / "ledger.jsonl")


def test_simulate_refuses_an_unaffordable_cap_before_loading_data(tmp_path, capsys):
    from fedveil.cli.main import main

    rc = main(
        [
            "simulate",
            "--rounds",
            "1",
            "--out",
            str(tmp_path / "run"),
            *("--set", "data.data_dir=/nonexistent/fv", "--set", "server.mode=async"),
            *("--set", "server.max_participations=40", "--set", "dp.mechanism=central"),
            *("--set", "dp.epsilon=1", "--set", "dp.noise_multiplier=0.8"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "server.max_participations = 40" in err and "> dp.epsilon = 1" in err
    assert "nonexistent" not in err  # refused before the data was looked for


def test_secure_aggregation_groups_under_central_dp(tmp_path):
    """Each group's sum is unmasked at the server (a trusted curator under central DP),
    noised at the apply, and each client is in at most one release per dispatch."""
    cfg = dp_config(
        tmp_path / "run",
        **{
            "secagg.enabled": True,
            "server.group_size": 3,
            "server.buffer": 3,
            "server.max_participations": 3,
            "dp.noise_multiplier": 2.5,
        },
    )
    engine, store = run(cfg)
    assert engine.scheduler.secagg and engine.round == 6
    result = verify_ledger(store.ledger_path)
    assert result.ok, result.message
    assert result.final_epsilon == pytest.approx(engine.privacy.bound)
    # Counted per dispatch (a group's session sends each member several requests).
    dispatches = Counter(r["client"] for r in store.read_private() if r.get("kind") == "dispatch")
    assert max(dispatches.values()) <= 3


def test_a_cap_spent_on_failing_clients_says_what_they_failed_with(tmp_path):
    # Every client's data is NaN, so every update is refused: the cap runs out with no
    # server update, and the reason must name the clients' failure, not only the cap.
    cfg = dp_config(tmp_path / "run", **{"server.max_participations": 1})
    task = tiny_task.make_nan(cfg)
    store = RunStore(cfg.out)
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        engine = life.engine(transport, availability=AvailabilityModel.from_config(cfg))
        engine.run()
    reason = engine.stopped_reason or ""
    assert engine.round == 0 and "server.max_participations = 1 reached" in reason
    assert "12 client failures" in reason and "NaN" in reason, reason
