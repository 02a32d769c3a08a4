"""kill -9 of the coordinator between a drift run's creation and the drift state's next
write: the run it created is adopted at the next start (a DP evaluation's reservation bound
to it, so it is settled), and no second evaluation is submitted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_drift_refusals import dp_version

from fedveil.server.coordinator.drift import DriftMonitor
from fedveil.server.coordinator.runs import RunManager

pytestmark = pytest.mark.procs  # starts processes (make test-fast leaves it out)

# The coordinator's drift monitor, in a process of its own, held in the window: the run is
# created (RunManager.submit returned) and the drift state not yet written again.
HELD = """
import json, sys, time
from pathlib import Path
from fedveil.server.coordinator.drift import DriftMonitor
from fedveil.server.coordinator.runs import RunManager
from fedveil.server.coordinator.settings import settings_from_dict

raw, base = json.loads(sys.argv[1]), Path(sys.argv[2])
settings = settings_from_dict(raw, base)

class HeldAfterSubmit(RunManager):
    def submit(self, *args, **kwargs):
        view = super().submit(*args, **kwargs)
        (base / "submitted").write_text(view["id"])
        time.sleep(600)  # killed here
        return view

manager = HeldAfterSubmit(settings, link=None)
DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6).tick()
"""


@pytest.mark.parametrize("dp", [True, False], ids=["dp", "no-dp"])
def test_kill_9_in_the_submission_window(tmp_path: Path, dp: bool) -> None:
    training = {} if dp else {"dp.mechanism": "none"}
    drift = {"clients": 3, "interval_s": 3600}  # one evaluation due, no more
    settings, version = dp_version(tmp_path, drift, **training)
    raw = {
        "state_dir": "state",
        "tls": {"insecure": True},
        "runs": {"allowed_tasks": ["tiny_task:make"]},
        "drift": {"enabled": True, "model": "tiny-blobs"} | drift,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD, json.dumps(raw), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    marker = tmp_path / "submitted"
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, "the drift monitor exited before submitting"
        assert time.monotonic() < deadline, "no submission"
        time.sleep(0.05)
    orphan = marker.read_text()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    manager = RunManager(settings, link=None)  # the restarted coordinator
    monitor = DriftMonitor(settings.drift, settings.state_dir, manager, connected=lambda: 6)
    monitor.tick()
    state = monitor.state()
    assert manager.run_ids() == [orphan]  # no second evaluation
    assert state.get("submitting") is None
    # Adopted, and closed at once (its run failed to start: no SuperLink here): the
    # evaluation is in the history, under DP its reservation bound to it and settled.
    (entry,) = state["history"]
    assert entry["run_id"] == orphan and entry["version"] == version.ref
    if dp:
        (charge,) = state["charges"][version.ref]
        assert charge["run_id"] == orphan and charge["status"] == "refunded"
    monitor.tick()
    assert manager.run_ids() == [orphan] and len(monitor.state()["history"]) == 1
