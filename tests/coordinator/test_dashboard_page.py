"""The dashboard as a person sees it, in headless Chromium, against fixed API answers.

The page and its CSP come from the real dashboard router; /cluster, /runs and the
per-run reads answer fixed data (a completed run, a completed run that applied
nothing, a failed run at 0/5, a DP run whose public rounds carry only a status).
No deployment is needed, so this runs in seconds.
"""

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

from fedveil.server.coordinator.clients import ClientRegistry
from fedveil.server.coordinator.routes import dashboard_api

NOW = 1_750_000_000.0


def _run(rid: str, status: str, done: int, applied: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "name": rid,
        "status": status,
        "created_at": NOW,
        "finished_at": NOW + 60,
        "rounds": 5,
        "rounds_completed": done,
        "rounds_applied": applied,
        "phase": None,
        "clients_connected": 3,
        "error": None,
        "attempts": [{}],
        "num_clients": 5,
        "per_round": 3,
        "model": "mlp",
        "bytes_sent": 1_000_000,
        "bytes_received": 2_000_000,
        **extra,
    }


DIVERGED = "the model diverged or learned nothing: its test accuracy 0.1000 is at chance level"
RUNS = [
    _run("dp", "completed", 5, 4, dp="central", rounds_aborted=1),
    _run("empty", "completed", 3, 0, rounds_aborted=3),
    _run("failed", "failed", 0, 0, error="a client failed its checks"),
    _run("plain", "completed", 5, 5),
    # issue 30: a DP run before its first round, one that lost rounds, one that diverged
    _run("fresh", "queued", 0, 0, dp="distributed"),
    _run("aborted", "completed", 5, 3, rounds_aborted=2),
    _run("diverged", "completed", 5, 5, model_version="mlp@3", model_version_warning=DIVERGED),
]
DROPS = {  # round: (dropped, drops by failed check)
    1: (0, {}),
    2: (3, {"norm_bound": 2, "nan_coordinates": 1}),
    3: (0, {}),
    4: (1, {"norm_bound": 1}),
    5: (2, {"norm_bound": 1, "deadline": 1}),
}
PLAIN_ROUNDS = [
    {
        "round": r,
        "status": "applied",
        "applied": True,
        "cohort_aggregated": 3,
        "dropped": DROPS[r][0],
        "drops_by_reason": DROPS[r][1],
        "clients_connected": 3,  # equal to cohort_aggregated: both lines must stay visible
        "train_loss": 2.0 / r,
        "test_loss": 2.0 / r,  # equal to train_loss
        "test_accuracy": 0.5 + r / 20,
    }
    for r in range(1, 6)
]
DP_ROUNDS = [  # the public view of a DP run: a status per round, no counts
    {
        "round": r,
        "status": "aborted" if r == 3 else "applied",
        "test_loss": 1.0 / r,
        "test_accuracy": 0.6,
        "epsilon": 0.5 * r,
        "clients_connected": 3,
    }
    for r in range(1, 6)
]
EMPTY_ROUNDS = [{"round": r, "status": "aborted", "test_loss": 2.3} for r in range(1, 4)]
ABORTED_ROUNDS = [
    {**r, "status": "aborted", "applied": False} if r["round"] in (2, 4) else r
    for r in PLAIN_ROUNDS
]
ROUNDS = {
    "dp": DP_ROUNDS,
    "empty": EMPTY_ROUNDS,
    "failed": [],
    "plain": PLAIN_ROUNDS,
    "fresh": [],
    "aborted": ABORTED_ROUNDS,
    "diverged": PLAIN_ROUNDS,
}


def fixture_app(selected: str, asked: list[tuple[str, int, int]] | None = None) -> FastAPI:
    """`asked`, when given, collects each rounds request's (run, since, limit)."""
    app = FastAPI()
    app.include_router(dashboard_api.router)
    runs = sorted(RUNS, key=lambda r: r["id"] != selected)  # the page selects the first

    @app.get("/cluster")
    def cluster() -> dict[str, Any]:
        return {
            "superlink": "up",
            "clients_connected": 3,
            "nodes_unmapped": 2,
            "client_auth": True,
            "tls": True,
        }

    @app.get("/runs")
    def list_runs() -> list[dict[str, Any]]:
        return runs

    @app.get("/runs/{rid}/rounds")
    def rounds(rid: str, since: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        if asked is not None:
            asked.append((rid, since, limit))
        return [r for r in ROUNDS[rid] if r["round"] > since][:limit]

    @app.get("/runs/{rid}/privacy")
    def privacy(rid: str) -> dict[str, Any]:
        return {"budget_epsilon": 4.0, "epsilon": 2.5} if rid == "dp" else {}

    return app


def _serve(app: FastAPI) -> tuple[uvicorn.Server, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "fixture server did not start"
        time.sleep(0.05)
    return server, port


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,1400",
    "--virtual-time-budget=5000",
]


def chromium(port: int, tmp_path: Path, *args: str, path: str = "/dashboard") -> str:
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    url = f"http://127.0.0.1:{port}{path}"
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    return done.stdout


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("needs Chromium (apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("dash")
    out = {}
    for selected in ("plain", "dp", "failed", "empty", "fresh", "aborted", "diverged"):
        server, port = _serve(fixture_app(selected))
        try:
            dom = chromium(port, tmp, "--dump-dom")
            shot = tmp / f"dashboard-{selected}.png"
            chromium(port, tmp, f"--screenshot={shot}")
        finally:
            server.should_exit = True
        out[selected] = (dom, shot)
    return out


def _rows(dom: str) -> dict[str, str]:
    return dict(re.findall(r'<tr[^>]*data-run="(\w+)"[^>]*>(.*?)</tr>', dom, re.S))


@pytest.mark.procs
def test_progress_bars_show_the_share_of_rounds_done(pages):
    dom, _ = pages["plain"]
    assert 'data-loaded="1"' in dom and "data-error" not in dom
    rows = _rows(dom)
    # The widths come through the CSSOM, which the page's CSP (style-src 'self') allows.
    widths = {
        rid: re.search(r'data-pct="(\d+)" style="width: (\d+)%;"', row).groups()
        for rid, row in rows.items()
    }
    assert widths == {
        "dp": ("100", "100"),
        "empty": ("60", "60"),
        "failed": ("0", "0"),
        "plain": ("100", "100"),
        "fresh": ("0", "0"),
        "aborted": ("100", "100"),
        "diverged": ("100", "100"),
    }


@pytest.mark.procs
def test_a_run_that_applied_nothing_gets_no_green_badge(pages):
    rows = _rows(pages["plain"][0])
    assert 'class="status completed"' in rows["plain"]
    # 4 of its 5 public rounds applied, one aborted: not a plain success either
    assert 'class="status completed-warn">completed, 1 aborted<' in rows["dp"]
    assert 'class="status completed-empty">completed, nothing applied<' in rows["empty"]
    assert 'class="status failed"' in rows["failed"]
    # The detail header says the same, from the public rounds' status alone.
    dom = pages["empty"][0]
    assert re.search(r'id="run-status" class="status completed-empty">completed, nothing', dom)
    assert "applied <b>0</b>" in dom


@pytest.mark.procs
def test_connected_count_and_unknown_nodes_are_shown_apart(pages):
    dom = pages["plain"][0]
    assert "3 clients connected · 2 unknown nodes" in dom


@pytest.mark.procs
def test_times_carry_their_utc_offset(pages):
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC[+-]\d\d:\d\d", pages["plain"][0])


@pytest.mark.procs
def test_drop_reasons_are_counted_per_check_without_dp(pages):
    dom = pages["plain"][0]
    assert 'id="drops" data-view="public"' in dom
    rows = re.findall(
        r'<tr data-reason="(\w+)"><td class="mono">\1</td><td class="num">(\d+)</td>'
        r".*?(\d+)%</td><td>([\d, ]+)</td></tr>",
        dom,
    )
    assert rows == [
        ("norm_bound", "4", "67", "2, 4, 5"),
        ("deadline", "1", "17", "5"),
        ("nan_coordinates", "1", "17", "2"),
    ]
    assert "dropouts <b>6</b>" in dom


@pytest.mark.procs
def test_drop_reasons_are_withheld_publicly_under_dp(pages):
    dom = pages["dp"][0]
    assert 'id="drops" data-view="withheld"' in dom and "data-reason" not in dom
    assert "Drop reasons are withheld under DP" in dom
    assert "GET /runs/dp/rounds/private</span> with the admin token" in dom


@pytest.mark.procs
def test_screenshots_render(pages):
    from PIL import Image

    for selected, (_, shot) in pages.items():
        assert shot.stat().st_size > 10_000, selected
        image = Image.open(shot).convert("RGB")
        assert image.tobytes().count(bytes([0x25, 0x63, 0xEB])) > 50, selected
        keep = os.environ.get("FEDVEIL_DASHBOARD_SHOTS")  # a folder to look at them in
        if keep:
            shutil.copy(shot, Path(keep) / shot.name)


def test_only_nodes_mapped_to_enrolled_clients_are_connected(tmp_path):
    registry = ClientRegistry(tmp_path)
    registry._save(
        {  # as enrolment writes it: client id -> its node
            0: {"node_id": 101},
            1: {"node_id": 102},
            2: {"node_id": 103, "revoked_at": NOW},
        }
    )
    # 104 was registered behind the coordinator's back; 103 is revoked; 102 is offline.
    assert registry.connected({101, 103, 104}) == 1
    assert registry.connected(set()) == 0


@pytest.mark.procs
def test_a_dp_run_before_its_first_round_says_dp_is_on(pages):
    # Used to say "no privacy report: DP is off for this run".
    dom = pages["fresh"][0]
    assert 'data-empty="DP is on (distributed): no release yet' in dom
    assert "DP is off" not in dom
    assert 'data-link="privacy-report"' in dom


@pytest.mark.procs
def test_a_dp_run_links_its_privacy_report_and_a_plain_one_does_not(pages):
    assert 'href="/runs/dp/privacy?format=html" data-link="privacy-report"' in pages["dp"][0]
    assert 'data-link="privacy-report"' not in pages["plain"][0]


@pytest.mark.procs
def test_aborted_rounds_and_a_diverged_run_are_marked(pages):
    rows = _rows(pages["plain"][0])
    assert 'class="status completed-warn">completed, 2 aborted<' in rows["aborted"]
    assert 'class="status completed-warn">completed, diverged<' in rows["diverged"]
    assert re.search(r'class="warn" data-fact="aborted">aborted <b>2</b>', pages["aborted"][0])
    dom = pages["diverged"][0]
    assert 'data-fact="diverged">mlp@3: the model diverged or learned nothing' in dom


@pytest.mark.procs
def test_a_run_has_its_own_url(tmp_path):
    if CHROMIUM is None:
        pytest.skip("needs Chromium (apt-get install -y chromium)")
    server, port = _serve(fixture_app("plain"))  # the page would select "plain" first
    try:
        dom = chromium(port, tmp_path, "--dump-dom", path="/dashboard/runs/aborted")
    finally:
        server.should_exit = True
    assert re.search(r'id="run-title" class="mono">aborted<', dom), dom[:2000]
    assert 'href="/dashboard/runs/aborted">link to this run<' in dom


@pytest.mark.procs
def test_the_legend_names_only_the_series_drawn(pages):
    # The plain run has no federated evaluation: its accuracy chart used to show a
    # "federated" swatch for a line that is not there. The clients chart keeps all three
    # (dropped is 0 in some rounds, a value, not a gap).
    dom = pages["plain"][0]
    assert re.search(r'id="chart-accuracy"[^>]*data-legend="central"', dom), dom
    assert re.search(r'id="chart-clients"[^>]*data-legend="connected,dropped,aggregated"', dom)


@pytest.mark.procs
def test_the_dashboard_polls_only_the_rounds_after_those_it_holds(tmp_path: Path) -> None:
    """Each poll fetched the run's whole history; now the first asks from round 0 and
    every later one from the last round the page holds, which still shows them all."""
    if CHROMIUM is None:
        pytest.skip("needs Chromium (apt-get install -y chromium)")
    asked: list[tuple[str, int, int]] = []
    server, port = _serve(fixture_app("plain", asked))
    try:
        dom = chromium(port, tmp_path, "--dump-dom")  # 5 s of page time: two polls or more
    finally:
        server.should_exit = True
    last = PLAIN_ROUNDS[-1]["round"]
    assert asked[0] == ("plain", 0, 1000) and len(asked) >= 2, asked
    assert all(a == ("plain", last, 1000) for a in asked[1:]), asked
    applied = sum(1 for r in PLAIN_ROUNDS if r.get("applied"))
    assert re.search(rf"applied <b>{applied}</b>", dom), dom[:2000]
