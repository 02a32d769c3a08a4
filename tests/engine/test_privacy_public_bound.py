"""Under distributed DP the public files state only the coordinator's data-independent
bound (docs/explanation/trust-model.md), and a budget against the coordinator stops on that bound.

The observer holds the signed ledger, metrics.jsonl and summary.json. Two runs whose only
difference is how often clients took part (the same client in every round, or disjoint
cohorts) must give that observer the same privacy figures; only the operator's annex
(private/rounds.jsonl) shows the realised per-client maximum. The busiest client's count
must not leak through the stopping round either: with budget_against = 'coordinator' the
run stops where the bound (a client in every released round) reaches the budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tiny_task
from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.privacy.dp import Ledger, canonical_json, entry_hash
from fedveil.privacy.dp.accounting import individual_epsilon
from fedveil.privacy.dp.ledger import signed_message
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.server.engine.dp_from_config import dp_config, plan_distributed_dp
from fedveil.server.engine.pipeline import make_privacy_pipeline, private_run_args
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.inprocess import InProcessTransport

CLIENTS = 12
SAME = [0, 1, 2, 3, 4, 5]
OTHER = [6, 7, 8, 9, 10, 11]
# Ledger fields that differ between any two runs whatever took part.
# `opening`: every schema-3 entry names its run's opening record (a per-run hash).
PER_RUN = ("timestamp", "run_id", "hash", "prev_hash", "key_id", "signature", "opening")
PER_RUN_FIRST = ("cohort_commitment",)  # a hash of the run's fresh secret cohort key
PRIVACY_KEYS = (
    "dp",
    "epsilon",
    "epsilon_coordinator_bound",
    "budget_against",
    "delta",
    "budget_epsilon",
    "noise_multiplier",
    "sampling_rate",
    "neighbouring",
    "rounds",
    "stopped_reason",
)


class GivenCohorts:
    """The sampler's interface (sampling.CohortDraws) with the participation pattern
    the test plays."""

    source = "csprng"  # as the run's own secret sampler would state it

    def __init__(self, cohorts: list[list[int]]) -> None:
        self.cohorts, self.drawn = cohorts, 0

    def sample(self) -> list[int]:
        self.drawn += 1
        return list(self.cohorts[(self.drawn - 1) % len(self.cohorts)])

    def state(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def restore(self, state: dict[str, Any]) -> None:
        self.drawn = int(state["drawn"])


def config(out: Path, **overrides: Any):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": CLIENTS,
        "server.sampling": "fixed",
        "server.per_round": 6,
        "server.rounds": 3,
        "out": str(out),
        "dp.mechanism": "distributed",
        "dp.noise_multiplier": 1.0,
        "dp.epsilon": 1000.0,
        "dp.delta": 1e-3,
        "secagg.enabled": True,
    }
    values.update(overrides)
    return load_config(None, values)


def run(cfg, cohorts: list[list[int]]) -> tuple[dict[str, Any], RunStore]:
    """A distributed-DP run on the real in-process transport, cohorts as given."""
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    privacy, channel = make_privacy_pipeline(
        cfg, task, store.ledger_path, **private_run_args(cfg, store)
    )
    transport = InProcessTransport(task, run_config=cfg)
    engine = RoundEngine(cfg, task, transport, store=store, channel=channel, privacy=privacy)
    engine.sampler = GivenCohorts(cohorts)
    try:
        summary = engine.run()
    finally:
        transport.close()
    return summary, store


def ledger_view(store: RunStore) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in store.ledger_path.read_text().splitlines()]
    for entry in entries:
        for name in (*PER_RUN, *PER_RUN_FIRST):
            entry.pop(name, None)
    return entries


def metrics_view(store: RunStore) -> list[dict[str, Any]]:
    # The model differs with who trained it; its test loss is the server's own data.
    drop = ("duration_s", "test_loss", "test_accuracy")
    return [{k: v for k, v in r.items() if k not in drop} for r in store.read_metrics()]


def test_public_files_are_the_same_whoever_took_part(tmp_path):
    busy, busy_store = run(config(tmp_path / "busy"), [SAME])  # clients 0-5 in all 3
    spread, spread_store = run(config(tmp_path / "spread"), [SAME, OTHER])  # at most 2
    # The operator's annex shows the difference: the realised largest figure.
    realised = [
        [r["epsilon_coordinator_max"] for r in store.read_private() if r.get("kind") == "close"]
        for store in (busy_store, spread_store)
    ]
    assert realised[0][0] > realised[1][0] > 0
    # The observer's files do not.
    assert ledger_view(busy_store) == ledger_view(spread_store)
    assert metrics_view(busy_store) == metrics_view(spread_store)
    assert {k: busy[k] for k in PRIVACY_KEYS} == {k: spread[k] for k in PRIVACY_KEYS}
    assert set(busy) == set(spread)
    public = [
        busy_store.ledger_path.read_text(),
        busy_store.metrics_path.read_text(),
        json.dumps(busy),
    ]
    assert not any("epsilon_coordinator_max" in text for text in public)
    # What they state is the bound for a client in every released round.
    final = Ledger(busy_store.ledger_path).entries[-1]
    assert final["kind"] == "final" and final["schema"] == "fedveil.dp.ledger/3"
    assert busy["epsilon_coordinator_bound"] == final["epsilon_coordinator_bound"]
    assert final["epsilon_coordinator_bound"] == pytest.approx(realised[0][0])  # busy: equal
    assert metrics_view(busy_store)[-1]["epsilon_coordinator_bound"] == pytest.approx(
        final["epsilon_coordinator_bound"]
    )
    # The operator's round records keep the realised figure, per round.
    private_rounds = [r for r in spread_store.read_private() if "cohort" in r]
    assert [r["epsilon_coordinator_max"] for r in private_rounds][-1] == realised[1][0]


def test_a_budget_against_the_coordinator_stops_where_the_bound_reaches_it(tmp_path, capsys):
    """Disjoint cohorts: no client takes part twice in a row, so the busiest client's
    count lags the number of releases. The run must stop where the bound says, which
    an observer can compute from the ledger's parameters, not where that count would."""
    probe = config(tmp_path / "probe")
    task = tiny_task.make(probe)
    model_size = sum(p.numel() for p in task.model_fn().parameters())
    plan = plan_distributed_dp(probe, model_size, CLIENTS)
    event = dp_config(probe, CLIENTS).round_event(plan.noise_multiplier)
    bound = [individual_epsilon([event] * n, 1e-3) for n in range(0, 6)]
    budget = (bound[2] + bound[3]) / 2  # room for 2 releases by the bound, 4 by the count
    cfg = config(
        tmp_path / "run",
        **{"server.rounds": 5, "dp.epsilon": budget, "dp.budget_against": "coordinator"},
    )
    summary, store = run(cfg, [SAME, OTHER])
    releases = Ledger(store.ledger_path).releases
    assert len(releases) == summary["rounds"] == 2
    assert "round 3 would bring epsilon (coordinator)" in summary["stopped_reason"]
    assert releases[-1]["epsilon_coordinator_bound"] == pytest.approx(bound[2])
    # The operator's figure: each client took part once.
    closing = [r for r in store.read_private() if r.get("kind") == "close"]
    assert closing[-1]["epsilon_coordinator_max"] == pytest.approx(bound[1])

    # `fedveil privacy verify` recomputes the bound from the ledger alone.
    assert main(["privacy", "verify", str(store.path)]) == 0
    capsys.readouterr()
    # The operator re-signs a ledger stating a lower bound (more room in the budget).
    entries = Ledger(store.ledger_path).entries
    for entry in entries:
        if "epsilon_coordinator_bound" in entry:
            entry["epsilon_coordinator_bound"] *= 0.9
    signer = load_or_create_signer()
    previous = "0" * 64
    for entry in entries:
        entry["prev_hash"] = previous
        entry["hash"] = entry_hash(entry)
        entry["signature"] = signer.sign(signed_message(entry["hash"])).hex()
        previous = entry["hash"]
    store.ledger_path.write_text("".join(canonical_json(e) + "\n" for e in entries))
    assert main(["privacy", "verify", str(store.path)]) == 1
    assert "epsilon_coordinator_bound" in capsys.readouterr().err
