"""Every release mechanism is used through the members release_mechanism.ReleaseMechanism
declares, the cohorts it constrains included (`cohort_sampler`): the engine never asks
which class a mechanism is."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import tiny_task
from fedveil.config import RunConfig, load_config
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.central_release import CentralDP
from fedveil.server.engine.ftrl_sampling import SchemaCohortSampler
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.release_mechanism import ReleaseMechanism
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.transport import ClientFailure, ReplySink
from fedveil.simulations.inprocess import InProcessTransport

BASE: dict[str, Any] = {
    "model.task": "tiny_task:make",
    "data.num_clients": 12,
    "server.per_round": 4,
    "server.rounds": 4,
    "dp.epsilon": 16.0,
    "dp.noise_multiplier": 2.0,
    "dp.clip_norm": 0.5,
}
ASYNC = {"server.mode": "async", "server.buffer": 3, "server.concurrency": 6}
ASYNC_GROUPS = {**ASYNC, "server.group_size": 3, "server.max_participations": 2}
FTRL = {
    "dp.mechanism": "ftrl",
    "server.sampling": "fixed",
    "dp.ftrl_factorization": "banded",
    "dp.ftrl_min_separation": 3,
    "dp.ftrl_max_participations": 1,
    "dp.epsilon": 8.0,
}
MECHANISMS: dict[str, dict[str, Any]] = {
    "central": {"dp.mechanism": "central"},
    "central_async": {"dp.mechanism": "central", **ASYNC, "server.max_participations": 2},
    "distributed": {"dp.mechanism": "distributed", "secagg.enabled": True},
    "distributed_async": {
        "dp.mechanism": "distributed",
        "secagg.enabled": True,
        **ASYNC_GROUPS,
    },
    "ftrl": FTRL,
}


def config(out: Path, overrides: Mapping[str, Any]) -> RunConfig:
    return load_config(None, {**BASE, **overrides, "out": str(out)})


def build(tmp_path: Path, overrides: Mapping[str, Any]) -> ReleaseMechanism:
    cfg = config(tmp_path / "run", overrides)
    privacy, _ = make_privacy_pipeline(cfg, tiny_task.make(cfg), tmp_path / "ledger.jsonl")
    assert privacy is not None
    return privacy


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_every_mechanism_has_the_declared_members(name: str, tmp_path: Path) -> None:
    privacy = build(tmp_path, MECHANISMS[name])
    assert isinstance(privacy, ReleaseMechanism), type(privacy).__name__
    sampler = privacy.cohort_sampler()
    if name == "ftrl":
        assert isinstance(sampler, SchemaCohortSampler) and sampler.source == "csprng"
    else:
        assert sampler is None, "the engine's own secret or seeded cohorts"


def test_the_ftrl_engine_draws_the_schema_cohorts_from_the_cohort_key(tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", FTRL)
    task = tiny_task.make(cfg)
    privacy, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    assert privacy is not None
    with InProcessTransport(task) as transport:
        engine = RoundEngine(cfg, task, transport, channel=channel, privacy=privacy)
    assert isinstance(engine.sampler, SchemaCohortSampler)
    same = privacy.cohort_sampler()
    assert same is not None
    drawn = [engine.sampler.sample() for _ in range(4)]
    assert drawn == [same.sample() for _ in range(4)], "keyed by the run's cohort key"
    # At most one participation each, three rounds apart: 4 rounds of 4 from 12 clients.
    flat = [cid for cohort in drawn for cid in cohort]
    assert len(flat) == len(set(flat))


class ListedCohorts:
    """A sampler of the interface (sampling.CohortDraws) that only allows set cohorts."""

    source = "csprng"

    def __init__(self, cohorts: list[list[int]]) -> None:
        self.cohorts, self.drawn = cohorts, 0

    @property
    def expected_size(self) -> float:
        return float(len(self.cohorts[0]))

    def sample(self) -> list[int]:
        self.drawn += 1
        return self.cohorts[self.drawn - 1]

    def state(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def restore(self, state: dict[str, Any]) -> None:
        self.drawn = int(state["drawn"])


class ListedCohortsDP(CentralDP):
    """A new mechanism whose guarantee constrains the cohorts, as DP-FTRL's does, through
    the declared member alone (it is no FtrlDP)."""

    def __init__(self, cohorts: list[list[int]], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listed = ListedCohorts(cohorts)

    def cohort_sampler(self) -> ListedCohorts:
        return self.listed


class RecordingTransport:
    """The in-process transport, recording who each exchange went to."""

    def __init__(self, inner: InProcessTransport) -> None:
        self.inner, self.sent = inner, []

    def client_ids(self) -> Any:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        self.sent.append(sorted(requests))
        return self.inner.exchange(requests, timeout_s, on_reply=on_reply)

    def close(self) -> None:
        self.inner.close()


def test_the_engine_draws_from_any_mechanism_that_constrains_cohorts(tmp_path: Path) -> None:
    cfg = config(tmp_path / "run", {"dp.mechanism": "central", "server.rounds": 2})
    task = tiny_task.make(cfg)
    cohorts = [[0, 3, 5, 7], [1, 2, 9, 11], [4, 6, 8, 10]]
    privacy = ListedCohortsDP(cohorts, cfg, task.num_clients, tmp_path / "ledger.jsonl")
    with InProcessTransport(task) as inner:
        transport = RecordingTransport(inner)
        engine = RoundEngine(cfg, task, transport, privacy=privacy)
        summary = engine.run()
    assert transport.sent == cohorts[:2]
    assert summary["cohort_source"] == "csprng"
