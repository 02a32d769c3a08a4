"""The dashboard's drift panel, in headless Chromium, against fixed API answers: the
watched model, the threshold, each evaluation's accuracy and outcome (a retraining run,
a skipped one), a DP refusal; hidden on a coordinator with drift off or without /drift."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from fedveil.server.coordinator.routes import dashboard

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)"
)
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
    "refused": "drift evaluation refused: the promoted version was trained with DP",
}


def fixture_app(drift: dict[str, Any] | None) -> FastAPI:
    app = FastAPI()
    app.include_router(dashboard.router)

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


def dom_of(drift: dict[str, Any] | None, tmp: Path) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
        return subprocess.run(cmd, capture_output=True, text=True, timeout=90).stdout
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


def test_a_refusal_is_shown_and_drift_off_hides_the_panel(tmp_path):
    panel = dom_of(REFUSED, tmp_path).split('id="drift"', 1)[1].split("</section>", 1)[0]
    assert "trained with DP" in panel and "no evaluation yet" in panel
    for state in ({**DRIFT, "enabled": False}, None):  # None: a coordinator without /drift
        dom = dom_of(state, tmp_path)
        assert 'data-loaded="1"' in dom
        assert re.search(r'<section class="card" id="drift" hidden=""', dom)
