"""Issue 33: the Fleet port is served by the SuperLink's own process, and stays served
across a SuperLink restart.

A real `fedveil server` with one enrolled device. The Fleet port must be a listening
socket of the SuperLink process (not only of `fedveil server`): there is no second
HTTP hop. The device's requests are counted in the coordinator's /metrics, which
`fedveil server` serves from the counters the SuperLink's process keeps. After the
SuperLink is killed, the supervisor starts a new one that serves the same port (the
socket handed down again), the counts go on from where they were, and the device is
served again.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from deploy_task import write_client_file
from deployment_harness import Deployment, wait_for
from proctree import listening_tcp_ports

pytestmark = pytest.mark.procs  # starts processes (make test-fast leaves it out)


def _superlink_pid(dep: Deployment) -> int:
    try:  # 0 while the file is being rewritten
        return int((dep.state / "superlink.pid").read_text())
    except (OSError, ValueError):
        return 0


def _fleet_requests(dep: Deployment) -> int:
    text = dep.http.get("/metrics").text
    match = re.search(r"^fedveil_fleet_requests_total (\d+)", text, re.M)
    assert match, text[:2000]
    return int(match.group(1))


def test_the_superlink_process_serves_the_fleet_port_across_a_restart(tmp_path: Path) -> None:
    dep = Deployment(tmp_path, clients=1)
    try:
        dep.start_server()
        first = _superlink_pid(dep)
        assert dep.fleet_port in listening_tcp_ports([first])
        dep.enroll(0)
        dep.start_client(0, "--data", str(write_client_file(tmp_path / "data", 1, 0, "npz")))
        wait_for(lambda: dep.connected() >= 1, 90, "the enrolled device to connect")
        wait_for(lambda: _fleet_requests(dep) >= 3, 30, "the device's requests counted")
        before = _fleet_requests(dep)

        os.kill(first, signal.SIGKILL)
        wait_for(
            lambda: _superlink_pid(dep) not in (0, first) and dep.ready(),
            90,
            "a new SuperLink ready",
        )
        second = _superlink_pid(dep)
        wait_for(
            lambda: dep.fleet_port in listening_tcp_ports([second]),
            30,
            "the new SuperLink to serve the Fleet port",
        )
        # The device polls on; its requests reach the new SuperLink and the counts go on.
        wait_for(lambda: _fleet_requests(dep) > before + 2, 90, "requests served after restart")
        assert dep.connected() >= 1
    finally:
        dep.close()
