"""Robust aggregation in the clear (`server.aggregator`): the rules on known inputs,
their attacker bounds, the config's refusals, and a run that records the bound check.

The attacker here is a client that sends whatever it likes: a huge update, a huge
claimed weight, or a colluding cluster placed to pull the aggregate."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest
import torch

from fedveil.config import ConfigError, load_config
from fedveil.config.robust_bounds import bound_holds, min_cohort
from fedveil.protocol.envelope import Envelope
from fedveil.server.engine.aggregation import Aggregate, PlainChannel
from fedveil.server.engine.robust import (
    RobustAggregator,
    bulyan,
    coordinate_median,
    krum_scores,
    multi_krum,
    multi_krum_select,
    norm_bounded_mean,
    trimmed_mean,
)
from fedveil.server.engine.transport import ClientFailure, ReplySink
from fedveil.simulations.simulate_run import simulate

DIM = 16


def honest_and_attackers(honest: int, attackers: int, seed: int = 0) -> torch.Tensor:
    """`honest` updates near 1.0, then `attackers` identical ones at -50 (colluding)."""
    g = torch.Generator().manual_seed(seed)
    good = 1.0 + 0.1 * torch.randn(honest, DIM, generator=g)
    bad = torch.full((attackers, DIM), -50.0)
    return torch.cat([good, bad])


# -- the rules on known inputs ------------------------------------------------------
def test_coordinate_median_of_vectors() -> None:
    x = torch.tensor([[1.0, 10.0, -3.0], [2.0, -5.0, 0.0], [100.0, 0.0, 1.0]])
    assert coordinate_median(x).tolist() == [2.0, 0.0, 0.0]
    even = torch.tensor([[1.0, 4.0], [3.0, 0.0], [5.0, 2.0], [1e9, -1e9]])
    assert coordinate_median(even).tolist() == [4.0, 1.0]


def test_trimmed_mean_drops_k_per_side_and_refuses_trimming_everything() -> None:
    x = torch.tensor([[1.0], [2.0], [3.0], [4.0], [1000.0]])
    assert trimmed_mean(x, 1).item() == pytest.approx(3.0)
    assert trimmed_mean(x, 0).item() == pytest.approx(202.0)
    with pytest.raises(ValueError, match="leaves nothing"):
        trimmed_mean(x[:4], 2)


def test_krum_picks_the_honest_cluster_with_f_attackers_at_n_2f_plus_3() -> None:
    f = 3
    x = honest_and_attackers(f + 3, f)  # n = 2f + 3 = 9
    assert x.shape[0] == 2 * f + 3
    winner = multi_krum_select(x, f, 1)[0]
    assert winner < f + 3  # an honest update
    assert multi_krum(x, f, 1).tolist() == x[winner].tolist()
    chosen = multi_krum_select(x, f, x.shape[0] - f)
    assert sorted(chosen) == list(range(f + 3))  # Multi-Krum keeps exactly the honest ones
    assert (multi_krum(x, f, x.shape[0] - f) - 1.0).abs().max() < 0.5
    # The plain mean is dragged far away by the same attackers.
    assert x.mean(dim=0).max() < -10


def test_krum_score_is_the_sum_of_squared_distances_to_n_minus_f_minus_2_neighbours() -> None:
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0]])
    # f = 0: 2 nearest others. Row 0: 1 + 9; row 1: 1 + 4; row 2: 4 + 9; row 3: 16 + 36.
    assert krum_scores(x, 0).tolist() == [10.0, 5.0, 13.0, 52.0]


def test_bulyan_stays_inside_the_honest_range_where_the_mean_does_not() -> None:
    f = 2
    x = honest_and_attackers(9, f)  # n = 11 = 4f + 3
    out = bulyan(x, f)
    honest = x[:9]
    assert (out >= honest.min(dim=0).values).all() and (out <= honest.max(dim=0).values).all()
    with pytest.raises(ValueError, match="4f \\+ 3"):
        bulyan(x[:6], f)


def test_norm_bound_clips_large_updates_and_leaves_small_ones() -> None:
    small = torch.tensor([0.3, 0.4])  # norm 0.5
    large = torch.tensor([30.0, 40.0])  # norm 50
    out, clipped = norm_bounded_mean(torch.stack([small, large]), 1.0)
    assert clipped == 1
    assert out.tolist() == pytest.approx(((small + large / 50) / 2).tolist())


def test_weak_dp_adds_noise_of_the_stated_std_repeatably() -> None:
    rule = RobustAggregator("norm_bound", norm_bound=1.0, weak_dp_noise=0.05, seed=7)
    zeros = torch.zeros(3, 200_000)
    first = rule.aggregate(zeros, round_num=1)
    std = first.update.double().std().item()
    assert std == pytest.approx(0.05, rel=0.01)
    assert first.update.double().mean().abs() < 0.001
    assert first.report["weak_dp_noise"] == 0.05
    assert torch.equal(rule.aggregate(zeros, 1).update, first.update)  # same run, same model
    assert not torch.equal(rule.aggregate(zeros, 2).update, first.update)


# -- bounds ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("aggregator", "f", "need"),
    [
        ("median", 2, 5),
        ("trimmed_mean", 2, 5),
        ("krum", 2, 7),
        ("multi_krum", 1, 5),
        ("bulyan", 2, 11),
    ],
)
def test_each_rule_needs_its_documented_cohort(aggregator: str, f: int, need: int) -> None:
    assert min_cohort(aggregator, f) == need
    assert bound_holds(aggregator, need, f) and not bound_holds(aggregator, need - 1, f)


def test_trimmed_mean_with_a_fraction_needs_at_least_f_trimmed_per_side() -> None:
    assert min_cohort("trimmed_mean", 2, 0.1) == 20  # floor(0.1 x 20) = 2
    assert not bound_holds("trimmed_mean", 19, 2, 0.1)


def test_a_round_below_the_bound_still_aggregates_and_says_so() -> None:
    rule = RobustAggregator("krum", f=2)
    x = honest_and_attackers(4, 2)  # n = 6 < 2f + 3
    report = rule.aggregate(x, 1).report
    assert report["robust_bound_held"] is False
    assert (report["robust_n"], report["robust_f"], report["robust_f_applied"]) == (6, 2, 1)
    assert rule.aggregate(honest_and_attackers(5, 2), 1).report["robust_bound_held"] is True


# -- the channel: individual updates, unweighted, after drops --------------------------
class ScriptedClients:
    """Clients whose replies are fixed up front; None: the client fails."""

    def __init__(self, replies: dict[int, Envelope | None]) -> None:
        self.replies = replies

    def client_ids(self) -> list[int]:
        return sorted(self.replies)

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        return {
            cid: r if (r := self.replies[cid]) is not None else ClientFailure(cid, "gone")
            for cid in requests
        }

    def close(self) -> None:
        pass


def train_reply(delta: torch.Tensor, weight: float, loss: float = 0.5) -> Envelope:
    config = {"num_examples": 10, "loss": loss, "weight": weight}
    return Envelope("train", 1, config, {"delta": delta.to(torch.float32)})


def collect(channel: PlainChannel, replies: dict[int, Envelope | None]) -> Aggregate:
    requests = {cid: Envelope("train", 1, {}) for cid in replies}
    agg = channel.collect(ScriptedClients(replies), requests, DIM, None)
    assert isinstance(agg, Aggregate)
    return agg


def test_median_channel_ignores_an_attackers_update_and_its_claimed_weight() -> None:
    x = honest_and_attackers(4, 1)
    replies: dict[int, Envelope | None] = {i: train_reply(x[i], 10.0) for i in range(4)}
    replies[9] = train_reply(x[4], 1e7, loss=1e30)  # claims 10^7 examples and any loss
    channel = PlainChannel(aggregator=RobustAggregator("median", f=1))
    agg = collect(channel, replies)
    assert agg.weight == 1.0 and agg.contributors == [0, 1, 2, 3, 9]
    assert (agg.mean - 1.0).abs().max() < 0.5
    assert agg.loss == 0.5
    report = channel.round_report(1)
    assert report["robust_bound_held"] is True and report["robust_n"] == 5
    # The plain mean, weighted by the claim, is the attacker's update.
    plain = collect(PlainChannel(), replies)
    assert plain.mean.max() < -40
    assert PlainChannel().round_report(1) == {}


def test_the_bound_is_checked_on_the_updates_that_arrived() -> None:
    x = honest_and_attackers(5, 0)
    replies: dict[int, Envelope | None] = {i: train_reply(x[i], 1.0) for i in range(5)}
    replies[3] = replies[4] = None  # two dropouts: 3 arrive, krum with f = 1 needs 5
    channel = PlainChannel(aggregator=RobustAggregator("krum", f=1))
    agg = collect(channel, replies)
    assert sorted(agg.dropped) == [3, 4]
    report = channel.round_report(1)
    assert report["robust_bound_held"] is False and report["robust_n"] == 3


# -- config refusals ---------------------------------------------------------------------
def config(**extra: object):
    overrides: dict[str, object] = {"data.num_clients": 100, "server.per_round": 20}
    overrides.update(extra)
    return load_config(None, overrides)


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (
            {"server.aggregator": "krum", "server.attackers_tolerated": 9},
            ("server.per_round = 20", "server.attackers_tolerated = 9", ">= 21"),
        ),
        (
            {"server.aggregator": "bulyan", "server.attackers_tolerated": 5},
            ("server.per_round", "'bulyan'", ">= 23"),
        ),
        (
            {
                "server.aggregator": "median",
                "server.attackers_tolerated": 3,
                "server.sampling": "poisson",
                "server.sample_rate": 0.05,
            },
            ("expected Poisson cohort 5", "server.sample_rate", ">= 7"),
        ),
        (
            {"server.aggregator": "median", "dp.mechanism": "central", "dp.epsilon": 8.0},
            ("dp.mechanism = 'central'", "no sound analysis"),
        ),
        (
            {"server.aggregator": "norm_bound", "server.norm_bound": 1.0, "secagg.enabled": True},
            ("secagg.enabled", "sees only the sum"),
        ),
        ({"server.attackers_tolerated": 2}, ("'mean'", "tolerates no attacker")),
        ({"server.aggregator": "median", "server.weak_dp_noise": 0.1}, ("server.weak_dp_noise",)),
        ({"server.aggregator": "norm_bound"}, ("server.norm_bound > 0",)),
        ({"server.trim_fraction": 0.1}, ("server.trim_fraction",)),
    ],
)
def test_config_refuses_with_the_fields_named(extra: dict[str, object], names: tuple[str]) -> None:
    with pytest.raises(ConfigError) as err:
        config(**extra)
    for name in names:
        assert name in str(err.value)


def test_config_accepts_a_cohort_at_the_bound() -> None:
    cfg = config(**{"server.aggregator": "krum", "server.attackers_tolerated": 8})
    assert cfg.server.aggregator == "krum"  # 20 >= 2 x 8 + 3
    assert config().server.aggregator == "mean"


# -- end to end ---------------------------------------------------------------------------
def test_a_median_run_applies_updates_and_records_the_bound(tmp_path) -> None:
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 4,
            "server.rounds": 6,
            "server.aggregator": "median",
            "server.attackers_tolerated": 1,
            "simulation.dropout": 0.4,
            "simulation.workers": 1,  # in process (fast tier): same result as workers
            "out": str(tmp_path / "run"),
        },
    )
    summary = simulate(cfg)
    with open(f"{cfg.out}/metrics.jsonl") as f:
        rounds = [json.loads(line) for line in f]
    checked = [r for r in rounds if "robust_bound_held" in r]
    assert checked and all(r["aggregator"] == "median" and r["robust_f"] == 1 for r in checked)
    for r in checked:
        assert r["robust_bound_held"] == (r["robust_n"] >= 3) == (r["cohort_aggregated"] >= 3)
    failed = sum(r["robust_bound_held"] is False for r in checked)
    assert 0 < failed < len(checked)  # dropouts left some rounds below the bound
    assert summary["aggregator"] == "median"
    assert summary["robust_bound_failed_rounds"] == failed
    assert summary["rounds_applied"] >= 1


@pytest.mark.parametrize(("aggregator", "survives"), [("mean", False), ("median", True)])
def test_sign_flipping_attackers_break_the_mean_and_not_the_median(
    tmp_path, aggregator: str, survives: bool
) -> None:
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 12,
            "server.rounds": 6,
            "server.aggregator": aggregator,
            "server.attackers_tolerated": 2 if survives else 0,
            "poisoning.attack": "sign_flip",
            "poisoning.fraction": 0.17,  # 2 of 12 clients, every round
            "poisoning.scale": 10.0,
            "simulation.workers": 1,  # in process (fast tier): same result as workers
            "out": str(tmp_path / "run"),
        },
    )
    summary = simulate(cfg)
    assert (summary["test_accuracy"] > 0.9) == survives
