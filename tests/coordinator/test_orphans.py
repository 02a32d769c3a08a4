"""Issue 18: after `kill -9` of the coordinator, no child of it lives on.

Flower starts its SuperExec in a session of its own and lets it, and each
ServerApp, poll for its parent: they used to outlive a killed coordinator by
4-12 s, holding the state dir and the run's files. Every descendant must now be
gone within GRACE_S: the kernel's SIGKILL down the tree (PR_SET_PDEATHSIG), not polling.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from deployment_harness import Deployment, run_toml, wait_for
from proctree import alive, cmdline, descendants

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

# Below the old polling's 4 s at the least, so the old code still fails; above what the
# kernel's chain of SIGKILLs (each generation's exit, then its children's) takes on a
# 2-core machine at load 20+, where 2 s was tight.
GRACE_S = 3.5


def _roles(pids: dict[int, int]) -> dict[str, list[int]]:
    roles: dict[str, list[int]] = {"superlink": [], "superexec": [], "serverapp": []}
    for pid in pids:
        line = cmdline(pid)
        for role, mark in (
            ("superlink", "flower-superlink"),
            ("superexec", "flower-superexec"),
            ("serverapp", "flwr-serverapp"),
        ):
            if mark in line:
                roles[role].append(pid)
    return roles


def test_kill_9_of_the_coordinator_takes_every_descendant_along(tmp_path):
    dep = Deployment(tmp_path)
    try:
        dep.start_server()
        assert dep.server is not None
        # A run in progress: its ServerApp waits for two devices that never come.
        dep.submit(run_toml(rounds=1, clients=2, per_round=2, seed=1, name="orphans"))
        root = dep.server.pid
        tree = wait_for(
            lambda: (d := descendants(root)) and all(_roles(d).values()) and d,
            60,
            "the SuperLink, its SuperExec and a ServerApp",
        )
        roles = _roles(tree)
        assert all(len(pids) >= 1 for pids in roles.values()), roles

        os.kill(root, signal.SIGKILL)
        dep.server.wait(10)
        dep.server = None
        killed = time.monotonic()
        while time.monotonic() - killed < GRACE_S:
            if not any(alive(pid, start) for pid, start in tree.items()):
                break
            time.sleep(0.05)
        left = {pid: cmdline(pid)[:120] for pid, start in tree.items() if alive(pid, start)}
        assert not left, f"alive {GRACE_S} s after kill -9 of the coordinator: {left}"
    finally:
        dep.close()
