"""A device's replies reach the coordinator even after its SuperNode got one it did not
wait for (client/supernode.py): a real coordinator, an honest device, and a device
whose first message is answered twice (late_reply_client.py).

With Flower's own SuperNode loop the extra reply is sent in place of the next
message's reply, every reply after it leaves one pull late, and the run below
(no round deadline) never finishes: what a coordinator crash during a download
did to a resumed run in CI.
"""

from __future__ import annotations

import re

import pytest
from deployment_harness import Deployment, run_toml, wait_for

pytestmark = [pytest.mark.flower, pytest.mark.slow]


def test_an_unexpected_reply_does_not_hold_back_the_next_ones(tmp_path):
    dep = Deployment(tmp_path, clients=2)
    try:
        dep.start_server()
        for cid in (0, 1):
            dep.enroll(cid)
        dep.start_client(0, "--task", "deploy_task:make")
        dep.start_client(1, script=dep.device_script(1, "late_reply_client.py"))
        wait_for(lambda: dep.connected() >= 2, 90, "both clients to connect")
        rid = dep.submit(run_toml(rounds=3, clients=2, per_round=2, seed=3, name="late"))
        run = dep.wait_status(rid, "completed", timeout=180)
        rounds = dep.rounds(rid)
        assert [r["round"] for r in rounds] == [1, 2, 3]
        assert all(r["cohort_aggregated"] == 2 and r["dropped"] == 0 for r in rounds), rounds
        assert run["summary"]["rounds_applied"] == 3
        assert "pushed an extra reply" in (dep.root / "client-1.log").read_text()
        # The SuperNode sent the extra reply on its own, between two messages.
        supernode = (dep.root / "client-1" / "supernode.log").read_text()
        events = re.findall(r"(Receiving|Sending): \S+ message", supernode)
        assert events.count("Sending") == events.count("Receiving") + 1, events
    finally:
        dep.close()
