"""`fedveil bench dpftrl`: the exact noise ratio and a tiny end-to-end run of every contender."""

from __future__ import annotations

import argparse

import pytest

from fedveil.benchmarks.bench_dpftrl import CONTENDERS, noise_rmse_ratio, run
from fedveil.privacy.dp.ftrl import ParticipationSchema


def test_the_issue_back_of_envelope_noise_ratio() -> None:
    # 3,000 clients, 100 per round, 300 rounds, b = 30 (k = 10): about 3.9 in the issue.
    ratio = noise_rmse_ratio(300, ParticipationSchema(30, 10))["noise_rmse_ratio"]
    assert ratio >= 3.0


def test_a_tiny_run_reports_every_key() -> None:
    args = argparse.Namespace(
        clients=200,
        per_round=10,
        rounds=12,
        seeds=1,
        epsilons="8",
        quick=False,
        json=True,
        accountant="rdp",
    )
    summary = run(args)
    assert summary["workload"]["min_separation"] == 20
    assert summary["noise_rmse_ratio"] > 1.0
    row = summary["results"]["8"]
    assert set(row) == set(CONTENDERS)
    for method in CONTENDERS:
        assert 0.0 <= row[method]["accuracy"] <= 1.0
    assert row["no_dp"]["sigma"] == 0.0
    # Same epsilon: q = 1 composition needs the most noise per round.
    assert row["dpfedavg_q1"]["sigma"] > row["dpfedavg_schema"]["sigma"]
    assert summary["accuracy_gain_eps8"] == pytest.approx(
        row["dp_ftrl"]["accuracy"] - row["dpfedavg_schema"]["accuracy"]
    )
