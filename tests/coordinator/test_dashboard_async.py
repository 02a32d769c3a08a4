"""The dashboard of an asynchronous run (server.mode async), in headless Chromium.

Each record of an async run is an applied model version with the staleness of its
updates and the clients in flight; the page says so (mode, staleness, stale drops, in
flight) and draws in-flight clients next to the aggregated ones. A DP run's public
records carry none of these keys, and its page shows none of them. Fixed API answers,
the real dashboard router: seconds, no deployment.
"""

from __future__ import annotations

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

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RUN = {
    "id": "fedbuff",
    "name": "fedbuff",
    "status": "running",
    "created_at": 1_750_000_000.0,
    "finished_at": None,
    "rounds": 12,
    "rounds_completed": 6,
    "rounds_applied": 6,
    "phase": None,
    "clients_connected": 20,
    "error": None,
    "attempts": [{}],
    "num_clients": 100,
    "per_round": 20,
    "model": "cnn",
    "bytes_sent": 1_000_000,
    "bytes_received": 2_000_000,
}
STALENESS = [[0, 0, 0, 1], [0, 1, 1, 2], [1, 2, 3, 0], [0, 1, 5, 1], [2, 1, 0, 0], [1, 1, 4, 0]]
ASYNC_ROUNDS = [
    {
        "round": v,
        "status": "applied",
        "applied": True,
        "mode": "async",
        "cohort_aggregated": 4,
        "dropped": 0,
        "staleness": taus,
        "stale_dropped": 1 if v == 4 else 0,
        "in_flight": 16 + v % 3,
        "sim_time_s": 1.5,
        "sim_clock_s": 1.5 * v,
        "test_accuracy": 0.4 + v / 20,
        "train_loss": 1.0 / v,
        "test_loss": 1.0 / v,
    }
    for v, taus in enumerate(STALENESS, start=1)
]
# Under DP the public records of the same run keep only what PUBLIC_UNDER_DP allows.
DP_ROUNDS = [
    {k: r[k] for k in ("round", "status", "test_accuracy", "test_loss")} for r in ASYNC_ROUNDS
]


def fixture_app(rounds: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()
    app.include_router(dashboard_api.router)

    @app.get("/cluster")
    def cluster() -> dict[str, Any]:
        return {"superlink": "up", "clients_connected": 20, "client_auth": True, "tls": True}

    @app.get("/runs")
    def runs() -> list[dict[str, Any]]:
        return [RUN]

    @app.get("/runs/{rid}/rounds")
    def run_rounds(rid: str) -> list[dict[str, Any]]:
        return rounds

    @app.get("/runs/{rid}/privacy")
    def privacy(rid: str) -> dict[str, Any]:
        return {}

    return app


def page(rounds: list[dict[str, Any]], tmp: Path, name: str) -> tuple[str, Path]:
    """The rendered DOM, and a screenshot (kept in tmp) of the page over `rounds`."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(fixture_app(rounds), host="127.0.0.1", port=port, log_level="error")
    )
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "fixture server did not start"
        time.sleep(0.05)
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars", "--window-size=1280,1200", "--virtual-time-budget=5000",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}/dashboard"
    shot = tmp / f"dashboard-{name}.png"
    try:
        outputs = []
        for extra in ("--dump-dom", f"--screenshot={shot}"):
            profile = tmp / f"profile-{time.monotonic_ns()}"
            cmd = [CHROMIUM, *flags, f"--user-data-dir={profile}", extra, url]
            outputs.append(subprocess.run(cmd, capture_output=True, text=True, timeout=90).stdout)
    finally:
        server.should_exit = True
    return outputs[0], shot


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
def test_an_async_run_shows_staleness_and_clients_in_flight(tmp_path):
    dom, shot = page(ASYNC_ROUNDS, tmp_path, "async")
    assert 'data-loaded="1"' in dom and "data-error" not in dom
    # 24 updates, taus summing to 27: mean 1.13 (1.125); the stalest was 5 versions old.
    assert "mode <b>async</b>" in dom
    assert "staleness <b>mean 1.13, max 5</b>" in dom
    assert "stale dropped <b>1</b>" in dom
    assert "in flight <b>16</b>" in dom  # the last version's (16 + 6 % 3)
    # The clients chart: dropped (6 zeros), aggregated (6) and in flight (6) points.
    assert 'id="chart-clients" width="560" height="240" data-points="18"' in dom
    assert shot.stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
def test_a_dp_async_run_shows_no_participation_figures(tmp_path):
    dom, _ = page(DP_ROUNDS, tmp_path, "dp")
    assert 'data-loaded="1"' in dom and "data-error" not in dom
    for absent in ("mode <b>", "staleness <b>", "stale dropped", "in flight <b>"):
        assert absent not in dom
