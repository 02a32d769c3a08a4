"""`fedveil bench fleet`'s emulator split over processes (fleet_emulator.py): how many
processes carry the devices, and how their tallies merge into one fleet's figures.
No process is started here; tests/bench/test_fleet_bench.py runs a split emulator
against real coordinators."""

from __future__ import annotations

import argparse

import pytest

from fedveil.benchmarks.fleet_devices import percentile
from fedveil.benchmarks.fleet_emulator import (
    DEVICES_PER_PROC,
    Fleet,
    ShareResult,
    procs_arg,
    procs_for,
)


def test_auto_gives_each_process_at_most_its_share_and_never_more_processes_than_devices() -> None:
    assert procs_for(1, None) == 1
    assert procs_for(DEVICES_PER_PROC, None) == 1
    assert procs_for(DEVICES_PER_PROC + 1, None) == 2
    assert procs_for(1000, None) == 3  # the 1,000 devices: 334 a process
    assert procs_for(1000, 4) == 4
    assert procs_for(3, 8) == 3


@pytest.mark.parametrize("bad", ["0", "-2", "two", "", "nan"])
def test_the_option_refuses_what_is_not_auto_or_a_positive_count(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
        procs_arg(bad)
    assert procs_arg("auto") is None and procs_arg("3") == 3


def _share(
    latencies: list[float], failures: dict[str, int], unanswered: int, cpu_s: float
) -> ShareResult:
    return ShareResult(
        devices=len(latencies),
        activate_s=0.5 + cpu_s,
        activation_failures={"http_503": 1} if failures else {},
        latencies=latencies,
        failures=failures,
        retries={"PullMessages http_503": 2},
        failed_devices=[7] if failures else [],
        unanswered=unanswered,
        cpu_s=cpu_s,
        window_s=20.0,
    )


def test_the_merged_tally_is_one_fleets_latencies_failures_and_cpu() -> None:
    fast = _share([0.01] * 98, {}, 0, 1.5)
    # The slow process's latencies alone set the fleet's p99: a mean of per-process
    # p99s, or the first process's figures, would not.
    slow = _share([0.02] * 97 + [2.0, 3.0, 4.0], {"PullMessages ReadTimeout": 1}, 2, 2.5)
    fleet = Fleet([fast, slow])
    tally = fleet.tally
    assert len(tally.latencies) == 198
    assert percentile(tally.latencies, 0.99) == 3.0
    assert percentile(tally.latencies, 0.50) == 0.02
    assert tally.failures == {"PullMessages ReadTimeout": 1, "unanswered": 2}
    assert tally.retries == {"PullMessages http_503": 4}
    assert tally.failed_devices == {7}
    assert fleet.cpu_s == 4.0  # the sum over the processes
    assert fleet.activate_s == 3.0  # the last process up
    assert fleet.activation_failures == {"http_503": 1}
    assert [fast.requests, slow.requests] == [98, 103]
