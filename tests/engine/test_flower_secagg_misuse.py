"""A Flower app set up so that no secure round can succeed stops at the first exchange,
with the fix in one message (issue 30), on Flower's real simulation engine: Flower's
default of 2 SuperNodes, and a ClientApp that forgot fedveil_secagg_mod. Both used to
abort every round (about 1,800 log lines of KeyError 'arrays') and exit 0 with the
initial model saved as the final one."""

from __future__ import annotations

import json
from typing import Any

import flower_quickstart_app as quickstart
import flower_secagg_app
import pytest
import torch
from flwr.app import ArrayRecord, Context
from flwr.server import Grid
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from local_ray import local_ray

from fedveil.cli.main import main
from fedveil.flower import BudgetExhausted, FlowerDP, SecureAggregationRefused, secure
from fedveil.server.engine.flower_secagg import SecureSettings


def _start(
    client_app: Any, nodes: int, dp: FlowerDP | None = None, **settings: Any
) -> dict[str, Any]:
    """The app's own server, as a Flower user writes it with secure(); what it raised."""
    out: dict[str, Any] = {}

    def main(grid: Grid, context: Context) -> None:
        # min_train_nodes as well: FedAvg sizes its sample from the nodes connected at
        # that moment, before it waits for min_available_nodes, so a SuperNode that
        # registered late left a train exchange of 2 (the refusal, 1 run in ~5 here).
        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_available_nodes=nodes,
            min_train_nodes=nodes,
        )
        torch.manual_seed(0)
        wrapped = secure(grid, strategy, dp=dp, **settings)
        try:
            strategy.start(
                grid=wrapped,
                initial_arrays=ArrayRecord(quickstart.Net().state_dict()),
                num_rounds=3,
            )
        except (SecureAggregationRefused, BudgetExhausted) as exc:
            out["error"] = str(exc)
        out["releases"] = wrapped.releases

    local_ray()
    app = ServerApp()
    app.main()(main)
    run_simulation(
        server_app=app,
        client_app=client_app,
        num_supernodes=nodes,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    return out


@pytest.mark.flower
def test_flowers_default_two_supernodes_stop_at_once_naming_the_fix():
    # The exchange waits node_wait_s for a third node to connect (none will here).
    out = _start(flower_secagg_app.app, nodes=2, node_wait_s=1.0)
    assert "secure aggregation needs at least 3 nodes per round" in out["error"]
    assert "has 2 of 2 connected nodes (after waiting 1 s for more)" in out["error"]
    assert "--federation-config num-supernodes=3" in out["error"]


@pytest.mark.flower
def test_a_client_app_without_the_mod_stops_at_once_naming_it():
    out = _start(quickstart.app, nodes=3)  # the stock app: no fedveil_secagg_mod
    assert "lacks fedveil_secagg_mod" in out["error"], out
    assert "ClientApp(mods=[fedveil_secagg_mod])" in out["error"]


@pytest.mark.flower
def test_flower_dp_keeps_a_signed_ledger_and_stops_before_passing_its_budget(tmp_path, capsys):
    # Used to keep no budget, ledger or report: every round released whatever epsilon
    # it reached, and nothing said epsilon.
    probe = FlowerDP(clip=1.0, noise_multiplier=1.0)
    two, three = (probe.epsilon(k, 3, 3, 1e-5) for k in (2, 3))
    budget = (two + three) / 2
    run = tmp_path / "flower-dp"
    dp = FlowerDP(1.0, 1.0, budget=budget, out=str(run), rounds=3)
    out = _start(flower_secagg_app.app, nodes=3, dp=dp)
    assert out["releases"] == 2
    assert f"FlowerDP.budget = {budget:g}: release 3 would spend" in out["error"]
    ledger = [json.loads(line) for line in (run / "privacy" / "ledger.jsonl").open()]
    releases = [e for e in ledger if e.get("kind", "release") == "release" and "epsilon" in e]
    assert len(releases) >= 2 and releases[-1]["epsilon"] == pytest.approx(two, rel=1e-6)
    report = json.loads((run / "privacy" / "report.json").read_text())
    assert report["ledger_state"] == "final" and report["verification"]["ok"]
    assert (run / "privacy" / "report.html").is_file()
    capsys.readouterr()
    assert main(["privacy", "verify", str(run)]) == 0, capsys.readouterr()


def test_flower_dp_refuses_a_ledger_without_budget_or_rounds():
    with pytest.raises(ValueError, match="a signed ledger needs a budget"):
        FlowerDP(1.0, 1.0, out="runs/x")
    with pytest.raises(ValueError, match="rounds = num_rounds"):
        FlowerDP(1.0, 1.0, budget=8.0, out="runs/x")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 3601.0, True, "30"])
def test_the_wait_for_nodes_is_a_bounded_number_of_seconds(bad: Any) -> None:
    with pytest.raises(
        ValueError, match=r"node_wait_s = .*must be a number of seconds in \[0, 3600\]"
    ):
        SecureSettings(node_wait_s=bad)


@pytest.mark.parametrize(
    ("field", "bad", "limit"),
    [
        ("clip_range", float("nan"), "must be a finite number"),
        ("clip_range", -1.0, "must be > 0.0"),
        ("levels", 1, "must be >= 2"),
        ("levels", 2**80, "must be <= 1099511627776"),
        ("max_weight", -1, "must be >= 0"),
        ("dropout_rate", 5.0, "must be <= 0.8"),
        ("metric_range", float("inf"), "must be finite and > 0"),
        ("seed", -1, "must be an integer >= 0"),
    ],
)
def test_the_protocols_parameters_are_refused_by_name_at_construction(
    field: str, bad: Any, limit: str
) -> None:
    # The run config's limits ([secagg]); before, each was taken as given, to reach the
    # quantizer and the nodes only once the strategy's first round ran.
    with pytest.raises(ValueError, match=rf"SecureSettings\.{field} = .*{limit}"):
        SecureSettings(**{field: bad})
