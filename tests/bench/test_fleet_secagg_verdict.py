"""Issue 33: what `secagg_round_ok` of `fedveil bench fleet --secagg-round N` compares
(benchmarks/fleet_secagg_round.py, round_verdict).

The 200-device round on the quiet machine aggregated 199 devices (one missed the
masked-input stage and the protocol recovered its masks) and was compared with the
simulation of all 200: different cohorts, so it failed. Here a secure round of six
devices that lost device 2 is played by `fedveil simulate` with device 2 absent (real
models, real secure aggregation under a fresh rounding key): it equals the simulation
of the aggregated cohort within the quantisation tolerance, and does not equal the
simulation of all six (the old comparison). A round that loses more devices than
allowed is not ok whatever its sum, and the coordinator's record must agree with its
per-client drop lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import torch

from fedveil.benchmarks.fleet_secagg_round import (
    coordinator_drops,
    dropped_allowed,
    left_out,
    max_abs_diff,
    round_verdict,
    run_toml,
    simulated_model,
    tolerance,
)
from fedveil.config import config_from_dict
from fedveil.tasks import builtin_task

DEVICES = 6
LOST = 2
# The engine's per-client line in the run's server.log (round_steps.log_drops).
RUN_LOG = (
    "2026-11-28 20:34:01,000 INFO fedveil.server: round 1: client 2 dropped: "
    "dropped during secure aggregation\n"
    "2026-11-28 20:34:01,001 WARNING fedveil.server: round 1: 1 of 6 clients failed: "
    "1 x dropped during secure aggregation\n"
)


@pytest.fixture(scope="module")
def round_of_six(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The run's toml, its tolerance over the five aggregated, and three models: the
    round that lost device 2 ("deployed"), the simulation of the five, of all six."""
    values = tomllib.loads(run_toml(DEVICES, 3))
    values.pop("deploy")
    task = builtin_task(config_from_dict(values))
    weights = [len(task.client_data(c)) for c in range(DEVICES)]
    # One worker: no process pool in this test.
    toml = run_toml(DEVICES, 3, max(weights)) + "[simulation]\nworkers = 1\n"
    values = tomllib.loads(toml)
    values.pop("deploy")
    cfg = config_from_dict(values)
    out = tmp_path_factory.mktemp("verdict")
    survivors = [c for c in range(DEVICES) if c != LOST]
    return {
        "tol": tolerance(cfg, [weights[c] for c in survivors]),
        "deployed": simulated_model(toml, out / "deployed", [LOST]),
        "cohort": simulated_model(toml, out / "cohort", [LOST]),
        "all": simulated_model(toml, out / "all"),
    }


def _record(aggregated: int, dropped: int) -> dict:
    return {"round": 1, "applied": True, "cohort_aggregated": aggregated, "dropped": dropped}


def test_the_coordinators_drop_lines_name_the_dropped_devices() -> None:
    assert coordinator_drops(RUN_LOG, 1) == {2: "dropped during secure aggregation"}
    assert coordinator_drops(RUN_LOG, 2) == {}


def test_a_device_dropped_after_its_masked_input_is_in_the_sum(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine's drop line (round_steps.account_drops) says whether a dropped
    client's update is in the sum; the harness leaves out only the others."""
    import logging

    from fedveil.server.engine.aggregation import Aggregate
    from fedveil.server.engine.round_record import RoundRecord
    from fedveil.server.engine.round_steps import Collected, account_drops

    dropped = {2: "no reply before the deadline", 4: "dropped during secure aggregation"}
    agg = Aggregate(torch.zeros(3), 5.0, [0, 1, 2, 3, 5], 0.5, dropped)
    record = RoundRecord(1, DEVICES, 0, 0, applied=False)
    with caplog.at_level(logging.INFO, logger="fedveil.server"):
        account_drops(record, list(range(DEVICES)), Collected.of(agg), dp=False)
    drops = coordinator_drops(caplog.text, 1)
    assert set(drops) == {2, 4} and left_out(drops) == {4}
    assert (record.cohort_aggregated, record.dropped) == (5, 2)


def test_a_round_that_lost_one_device_equals_the_simulation_of_its_cohort(
    round_of_six: dict,
) -> None:
    r = round_of_six
    drops = coordinator_drops(RUN_LOG, 1)
    ok, why = round_verdict(r["deployed"], r["cohort"], r["tol"], _record(5, 1), drops, DEVICES)
    assert ok, why
    # Fresh rounding keys on each side: equal within the tolerance, not bit for bit.
    diff = max_abs_diff(r["deployed"], r["cohort"])
    assert diff is not None and 0.0 < diff <= r["tol"]
    # The old comparison, with the simulation of all six, fails on the same round.
    old = max_abs_diff(r["deployed"], r["all"])
    assert old is not None and not old <= r["tol"]
    ok, why = round_verdict(r["deployed"], r["all"], r["tol"], _record(5, 1), drops, DEVICES)
    assert not ok and "exceeds the tolerance" in why


def test_a_round_that_lost_too_many_devices_is_not_ok_whatever_its_sum(
    round_of_six: dict,
) -> None:
    r = round_of_six
    assert dropped_allowed(DEVICES) == 1 and dropped_allowed(200) == 2
    assert dropped_allowed(1000) == 10
    two = {2: "dropped during secure aggregation", 4: "timeout"}
    ok, why = round_verdict(r["deployed"], r["cohort"], r["tol"], _record(4, 2), two, DEVICES)
    assert not ok and "2 of 6 devices dropped, more than the 1 allowed" in why


def test_the_record_and_the_drop_lines_must_agree_and_nan_fails(round_of_six: dict) -> None:
    r = round_of_six
    drops = coordinator_drops(RUN_LOG, 1)
    # The record counts two dropped where the log names one: refused, not guessed.
    ok, why = round_verdict(r["deployed"], r["cohort"], r["tol"], _record(4, 2), drops, DEVICES)
    assert not ok and "does not match" in why
    ok, why = round_verdict(
        r["deployed"], r["cohort"], r["tol"], {**_record(5, 1), "applied": False}, drops, DEVICES
    )
    assert not ok and "not applied" in why
    nan = {k: v.clone() for k, v in r["deployed"].items()}
    first = next(iter(nan))
    nan[first].view(-1)[0] = float("nan")
    ok, why = round_verdict(nan, r["cohort"], r["tol"], _record(5, 1), drops, DEVICES)
    assert not ok and "exceeds the tolerance" in why
    ok, why = round_verdict(r["deployed"], r["cohort"], float("nan"), _record(5, 1), drops, DEVICES)
    assert not ok


def test_absent_clients_are_refused_unless_they_are_client_ids(tmp_path: Path) -> None:
    from fedveil.config import ConfigError, load_config

    for bad, says in (("3,x", "'x' is not a client id"), ("-1", "a client id is >= 0")):
        with pytest.raises(ConfigError, match=says):
            load_config(None, {"simulation.absent_clients": bad})
    with pytest.raises(ConfigError, match=r"not among data\.num_clients"):
        load_config(
            None,
            {"simulation.absent_clients": "7", "data.num_clients": 5, "server.per_round": 5},
        )
