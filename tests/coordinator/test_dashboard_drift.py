"""The dashboard's drift panel, in headless Chromium, against fixed API answers: the
watched model, the threshold, each evaluation's accuracy and outcome (a retraining run,
a skipped one); for a DP version each evaluation's epsilon and the budget spent and left,
and a refusal past the budget; hidden on a coordinator with drift off or without /drift.
A screenshot of the DP panel is kept (FEDVEIL_DASHBOARD_SHOTS: a folder to copy it to)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from loopback_ports import free_port

from fedveil.server.coordinator.routes import dashboard_api

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)"),
]
NOW = 1_750_000_000.0
RUN = {
    "id": "r1",
    "name": "retraining of blobs@1 (drift)",
    "status": "completed",
    "created_at": NOW,
    "finished_at": NOW + 60,
    "rounds": 2,
    "rounds_completed": 2,
    "rounds_applied": 2,
    "phase": None,
    "clients_connected": 3,
    "error": None,
    "attempts": [{}],
    "num_clients": 3,
    "per_round": 3,
    "model": "mlp",
    "bytes_sent": 1,
    "bytes_received": 1,
}
DRIFT = {
    "enabled": True,
    "model": "blobs",
    "interval_s": 3600.0,
    "threshold": 0.9,
    "last_evaluation_at": NOW + 7200,
    "pending": None,
    "refused": None,
    "history": [
        {
            "at": NOW,
            "run_id": "e1",
            "version": "blobs@1",
            "threshold": 0.9,
            "status": "completed",
            "accuracy": 0.03125,
            "below_threshold": True,
            "retrain_run": "r1",
            "retrain_status": "completed",
        },
        {
            "at": NOW + 3600,
            "run_id": "e2",
            "version": "blobs@1",
            "threshold": 0.9,
            "status": "completed",
            "accuracy": 0.95,
            "below_threshold": False,
        },
    ],
}
REFUSED = {
    **DRIFT,
    "history": [],
    "refused": "drift evaluation refused: 2 devices would evaluate (drift.clients = 5, 2 "
    "connected), and secure aggregation's threshold needs at least 3",
}
DP_SETTINGS = {"epsilon": 1.0, "delta": 1e-6, "budget": 2.5, "loss_cap": 5.0}
DP_ENTRY = {
    "version": "blobs@3",
    "threshold": 0.9,
    "status": "completed",
    "dp": True,
    "delta": 1e-6,
    "budget": 2.5,
    "charge": "charged",
}
DP_DRIFT = {
    **DRIFT,
    "model": "blobs",
    "dp": DP_SETTINGS,
    # The most-charged enrolled device across every version (drift_devices.py).
    "devices": {
        "per": "enrolled device, across every version",
        "budget": 8.0,
        "epsilon_spent_max": 5.3118,
        "budget_left": 2.6882,
        "evaluations_max": 21,
    },
    "refused": "drift evaluation of blobs@3 refused: its evaluations have spent epsilon "
    "1.694 of drift.budget = 2.5, and one more (drift.epsilon = 1) would compose to 2.18 > "
    "drift.budget; nothing is sent to the devices",
    "history": [
        {
            **DP_ENTRY,
            "at": NOW,
            "run_id": "d1",
            "accuracy": 0.95,
            "loss": 0.31,
            "below_threshold": False,
            "epsilon": 0.998,
            "epsilon_spent": 0.998,
            "budget_left": 1.502,
        },
        {
            **DP_ENTRY,
            "at": NOW + 3600,
            "run_id": "d2",
            "accuracy": 0.62,
            "loss": 1.2,
            "below_threshold": True,
            "retrain_run": "r1",
            "retrain_status": "completed",
            "epsilon": 0.998,
            "epsilon_spent": 1.694,
            "budget_left": 0.806,
        },
        {
            **DP_ENTRY,
            "at": NOW + 7200,
            "run_id": "d3",
            "status": "completed",
            "error": "secure aggregation aborted before unmasking",
            "charge": "refunded",
            "epsilon": 0.0,
            "epsilon_spent": 1.694,
            "budget_left": 0.806,
        },
    ],
}


def fixture_app(drift: dict[str, Any] | None) -> FastAPI:
    app = FastAPI()
    app.include_router(dashboard_api.router)

    @app.get("/cluster")
    def cluster() -> dict[str, Any]:
        return {"superlink": "up", "clients_connected": 3, "client_auth": True, "tls": True}

    @app.get("/runs")
    def runs() -> list[dict[str, Any]]:
        return [RUN]

    @app.get("/runs/{rid}/rounds")
    def rounds(rid: str) -> list[dict[str, Any]]:
        return [{"round": 1, "status": "applied", "applied": True, "test_accuracy": 0.5}]

    @app.get("/runs/{rid}/privacy")
    def privacy(rid: str) -> dict[str, Any]:
        return {}

    if drift is not None:

        @app.get("/drift")
        def drift_state() -> dict[str, Any]:
            return drift

    return app


def dom_of(drift: dict[str, Any] | None, tmp: Path, screenshot: Path | None = None) -> str:
    port = free_port()
    app = fixture_app(drift)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "fixture server did not start"
        time.sleep(0.05)
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1280,1400", "--virtual-time-budget=5000", "--dump-dom",
    ]  # fmt: skip
    profile = tmp / f"profile-{time.monotonic_ns()}"
    url = f"http://127.0.0.1:{port}/dashboard"
    try:
        cmd = [CHROMIUM, *flags, f"--user-data-dir={profile}", url]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=90).stdout
        if screenshot is not None:
            shot = [f.replace("--dump-dom", f"--screenshot={screenshot}") for f in cmd]
            shot[shot.index(f"--user-data-dir={profile}")] = f"--user-data-dir={profile}-shot"
            subprocess.run(shot, capture_output=True, text=True, timeout=90)
        return dom
    finally:
        server.should_exit = True


def test_drift_panel_shows_each_evaluation_and_its_outcome(tmp_path):
    dom = dom_of(DRIFT, tmp_path)
    assert 'data-loaded="1"' in dom and "data-error" not in dom
    panel = dom.split('id="drift"', 1)[1].split("</section>", 1)[0]
    assert not panel.startswith(" hidden")
    assert "model <b>blobs</b>" in panel and "threshold <b>0.900</b>" in panel
    rows = dict(re.findall(r'<tr[^>]*data-drift="(\w+)"[^>]*>(.*?)</tr>', panel, re.S))
    assert list(rows) == ["e2", "e1"]  # newest first
    assert "0.0313" in rows["e1"] and "retraining run r1 (completed)" in rows["e1"]
    assert "0.9500" in rows["e2"] and "at or above the threshold" in rows["e2"]
    assert re.search(r'<tr class="below" data-drift="e1"', panel)


def test_a_dp_version_shows_each_evaluations_epsilon_and_the_budget(tmp_path):
    shot = tmp_path / "dashboard-drift-dp.png"
    dom = dom_of(DP_DRIFT, tmp_path, screenshot=shot)
    assert 'data-loaded="1"' in dom and "data-error" not in dom
    panel = dom.split('id="drift"', 1)[1].split("</section>", 1)[0]
    assert "DP versions <b>ε 1.00 per evaluation</b> (δ 1e-6), budget <b>2.50</b>" in panel
    assert '<span id="drift-budget">blobs@3: spent <b>1.69</b>, left <b>0.81</b></span>' in panel
    assert "would compose to 2.18 &gt; drift.budget; nothing is sent to the devices" in panel
    assert (
        '<span id="drift-device-budget" data-epsilon="5.31">per device, all versions: spent '
        "<b>5.31</b> of 8.00 (21 evaluations), left <b>2.69</b></span>"
    ) in panel
    rows = dict(re.findall(r'<tr[^>]*data-drift="(\w+)"[^>]*>(.*?)</tr>', panel, re.S))
    assert list(rows) == ["d3", "d2", "d1"]
    assert "0.6200 (noised)" in rows["d2"] and "retraining run r1 (completed)" in rows["d2"]
    assert '<span data-epsilon="1.00">ε <b>1.00</b> · spent 1.69 of 2.50, 0.81 left' in rows["d2"]
    assert "spent 1.00 of 2.50, 1.50 left" in rows["d1"] and "0.9500 (noised)" in rows["d1"]
    assert "ε 0 (nothing unmasked: refunded)" in rows["d3"]
    assert "aborted before unmasking" in rows["d3"]
    for row in rows.values():  # a DP evaluation's view carries no count of devices
        assert "clients" not in row and "answered" not in row

    from PIL import Image

    assert shot.stat().st_size > 10_000
    image = Image.open(shot).convert("RGB")
    assert image.tobytes().count(bytes([0xDC, 0x26, 0x26])) > 50  # the red of a refusal
    keep = os.environ.get("FEDVEIL_DASHBOARD_SHOTS")  # a folder to look at it in
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)


def test_a_refusal_is_shown_and_drift_off_hides_the_panel(tmp_path):
    panel = dom_of(REFUSED, tmp_path).split('id="drift"', 1)[1].split("</section>", 1)[0]
    assert "secure aggregation's threshold needs at least 3" in panel
    assert "no evaluation yet" in panel
    for state in ({**DRIFT, "enabled": False}, None):  # None: a coordinator without /drift
        dom = dom_of(state, tmp_path)
        assert 'data-loaded="1"' in dom
        assert re.search(r'<section class="card" id="drift" hidden=""', dom)
