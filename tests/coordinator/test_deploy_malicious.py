"""Malicious-server secure aggregation on a real deployment: identities made on the devices,
a roster the operator hands to the coordinator and to each device, SuperNodes on loopback.

Clients 0-2 run with an identity key and the roster; client 3 has neither (and is not
in the roster). A malicious-mode run aggregates 0-2 and leaves 3 out by name; a run that
asks the identity holders for the semi-honest protocol gets nothing from them.
"""

from __future__ import annotations

import re

import pytest
from deployment_harness import Deployment, run_toml, wait_for

pytestmark = [pytest.mark.flower, pytest.mark.slow]

WITH_IDENTITY = (0, 1, 2)
WITHOUT = 3


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy-malicious")
    dep = Deployment(root, clients=4, extra_server_toml='[secagg]\nroster = "roster.json"\n')
    try:
        # Each device makes its own identity key; the operator lists the public halves.
        for cid in WITH_IDENTITY:
            made = dep.cli("identity", "keygen", "--name", f"client-{cid}", "--out", "identity")
            assert made.returncode == 0, made.stderr
        entries = [f"{cid}=identity/client-{cid}.identity.pub" for cid in WITH_IDENTITY]
        listed = dep.cli("identity", "roster", *entries, "--out", "roster.json")
        assert listed.returncode == 0, listed.stderr
        dep.fingerprint = re.search(r"fingerprint ([0-9a-f]{64})", listed.stdout).group(1)
        dep.start_server()
        for cid in (*WITH_IDENTITY, WITHOUT):
            dep.enroll(cid)
        for cid in WITH_IDENTITY:
            key = str(root / "identity" / f"client-{cid}.identity.key")
            roster = str(root / "roster.json")
            dep.start_client(
                cid, "--task", "deploy_task:make", "--identity-key", key, "--roster", roster
            )
        dep.start_client(WITHOUT, "--task", "deploy_task:make")
        wait_for(lambda: dep.connected() >= 4, 90, "four clients to connect")
        yield dep
    finally:
        dep.close()


def test_a_malicious_mode_run_aggregates_the_listed_clients(deployment):
    dep = deployment
    toml = run_toml(
        rounds=2,
        clients=4,
        per_round=4,
        seed=3,
        name="malicious",
        tables='[secagg]\nenabled = true\nthreat = "malicious"\n',
    )
    rid = dep.submit(toml)
    run = dep.wait_status(rid, "completed", timeout=240)
    rounds = dep.rounds(rid)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["applied"] and r["cohort_aggregated"] == 3 and r["dropped"] == 1, r
    assert run["summary"]["test_accuracy"] > 0.4
    log = (dep.state / "runs" / rid / "server.log").read_text()
    assert f"malicious-server mode: roster of 3 clients, fingerprint {dep.fingerprint}" in log
    assert "no identity key in the roster" in log
    # The run keeps the roster it was submitted with.
    assert (dep.state / "runs" / rid / "secagg_roster.json").is_file()
    for cid in WITH_IDENTITY:
        device_log = (dep.root / f"client-{cid}.log").read_text()
        assert (
            f"malicious-server mode only; roster of 3 clients, fingerprint {dep.fingerprint}"
            in (device_log)
        )
        assert "the update leaves masked" in device_log


def test_identity_holders_refuse_the_semi_honest_protocol(deployment):
    dep = deployment
    toml = run_toml(
        rounds=1,
        clients=4,
        per_round=4,
        seed=4,
        name="downgrade",
        extra="min_clients = 2",
        tables="[secagg]\nenabled = true\n",
    )
    rid = dep.submit(toml)
    dep.wait_status(rid, "completed", timeout=180)
    (record,) = dep.rounds(rid)
    assert not record["applied"]
    for cid in WITH_IDENTITY:
        device_log = (dep.root / f"client-{cid}.log").read_text()
        assert "runs secure aggregation only in malicious-server mode" in device_log
