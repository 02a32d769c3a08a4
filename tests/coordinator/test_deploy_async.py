"""Asynchronous training on devices: a server.mode = async run through the coordinator, with
a real SuperLink and real SuperNodes on loopback (TLS, SuperNode authentication).

The coordinator keeps C clients in flight, each device's reply arrives when it does
(the wall clock), a server update is applied after every K of them, and no dispatch is
applied twice. Under secure aggregation
each dispatch unit is a group of G clients running one protocol session, several
groups at once."""

from __future__ import annotations

import pytest
from deployment_harness import Deployment, run_toml, wait_for

pytestmark = [pytest.mark.flower, pytest.mark.slow]

CLIENTS = 6
C, K, VERSIONS = 3, 2, 3


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy-async")
    dep = Deployment(root, clients=CLIENTS)
    try:
        dep.start_server()
        for cid in range(CLIENTS):
            dep.enroll(cid)
            dep.start_client(cid, "--task", "deploy_task:make")
        wait_for(lambda: dep.connected() >= CLIENTS, 90, "six clients to connect")
        yield dep
    finally:
        dep.close()


def test_an_async_run_keeps_c_in_flight_and_applies_each_dispatch_once(deployment):
    dep = deployment
    toml = run_toml(
        rounds=VERSIONS,
        clients=CLIENTS,
        per_round=C,
        seed=5,
        name="async",
        extra=f'mode = "async"\nconcurrency = {C}\nbuffer = {K}',
    )
    rid = dep.submit(toml)
    run = dep.wait_status(rid, "completed", timeout=120)
    rounds = dep.rounds(rid)
    assert [r["round"] for r in rounds] == list(range(1, VERSIONS + 1))
    applied = [seq for r in rounds for seq in r["applied_dispatches"]]
    assert len(applied) == len(set(applied)) == K * VERSIONS  # none applied twice
    for r in rounds:
        assert r["mode"] == "async" and r["clock"] == "wall" and r["applied"]
        assert len(r["staleness"]) == r["cohort_aggregated"] == K
    # Replacements went out at once, C in flight (none after the last update: its work
    # could not be used).
    assert all(r["in_flight"] == C for r in rounds[:-1])
    # C in flight and K per update: some updates were computed on an older version.
    assert max(tau for r in rounds for tau in r["staleness"]) >= 1
    summary = run["summary"]
    assert summary["clock"] == "wall" and summary["updates_applied"] == K * VERSIONS
    assert summary["concurrency"] == C and summary["buffer"] == K
    assert summary["replays_dropped"] == 0 and summary["test_accuracy"] > 0.3
    log = (dep.state / "runs" / rid / "server.log").read_text()
    assert "run " + rid + " completed" in log


def test_secure_aggregation_groups_run_at_once_on_devices(deployment):
    """C = 6, G = K = 3: two groups dispatched at once, each one protocol session over the
    SuperLink; the first to finish is the update, the other still in flight."""
    dep = deployment
    toml = run_toml(
        rounds=1,
        clients=CLIENTS,
        per_round=6,
        seed=6,
        name="async-secagg",
        extra='mode = "async"\nconcurrency = 6\nbuffer = 3\ngroup_size = 3',
        tables="[secagg]\nenabled = true\n",
    )
    rid = dep.submit(toml)
    run = dep.wait_status(rid, "completed", timeout=150)
    (record,) = dep.rounds(rid)
    assert record["clock"] == "wall" and record["cohort_aggregated"] == 3
    assert record["aborted_groups"] == 0 and record["staleness"] == [0, 0, 0]
    assert len(record["applied_dispatches"]) == 1  # one group's masked sum
    assert record["in_flight"] == 3  # the other group's session was under way
    summary = run["summary"]
    assert summary["group_size"] == 3 and summary["units_unused_at_end"] == 1


def test_a_groups_unmask_ends_at_t_replies_without_its_slow_member_on_devices(deployment):
    """server.group_unmask = 'threshold' on the wall clock: a group of all G = 7 devices,
    one of which holds its unmask reply for SLOW_UNMASK_S (slow_unmask_client.py). The
    unmask stage ends at the first t = 2 shares of every secret (complete graph), so the
    group's sum is applied long before the slow device answers, with that device in it and
    nobody counted dropped. Refused on devices before ("runs on the simulated clock
    only"). Last in the module: the slow device is stopped at the end."""
    from slow_unmask_client import HOLDING, SLOW_UNMASK_S

    dep, slow = deployment, CLIENTS
    dep.enroll(slow)
    dep.start_client(slow, script=dep.device_script(slow, "slow_unmask_client.py"))
    try:
        g = CLIENTS + 1
        toml = run_toml(
            rounds=1,
            clients=g,
            per_round=g,
            seed=7,
            name="async-unmask-at-t",
            extra=f'mode = "async"\nconcurrency = {g}\nbuffer = {g}\ngroup_size = {g}\n'
            'group_unmask = "threshold"',
            tables="[secagg]\nenabled = true\n",
        )
        rid = dep.submit(toml)
        run = dep.wait_status(rid, "completed", timeout=150)
        (record,) = dep.rounds(rid)
        # The slow device was asked for its shares and held them ...
        log = dep.root / f"client-{slow}.log"
        wait_for(lambda: HOLDING in log.read_text(errors="replace"), 30, "the held reply")
        # ... and the group did not wait for them: its masked sum of all 7 was applied
        # sooner, the slow member in it and not counted as dropped.
        assert record["clock"] == "wall" and record["sim_clock_s"] < SLOW_UNMASK_S
        assert record["cohort_aggregated"] == g and record["aborted_groups"] == 0
        assert record["dropped"] == 0 and record["drops_by_reason"] == {}
        assert record["secagg_threshold"] == 2 and record["secagg_neighbors"] == g - 1
        summary = run["summary"]
        assert summary["group_size"] == g and summary["test_accuracy"] > 0.3
    finally:
        dep.kill_client(slow)
