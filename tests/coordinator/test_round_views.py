"""Drop reasons and cohort counts: public without DP, behind the admin token under DP.

The coordinator's real API (create_api over a Service that is not started: no
SuperLink is needed to read run directories) on real uvicorn over loopback; the
run directories are written here as the engine writes them (metrics.jsonl, and
under DP the private annex private/rounds.jsonl), so the test plays an outside
reader with and without the operator's token.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from loopback_ports import free_port

from fedveil.server.coordinator.api import create_api
from fedveil.server.coordinator.service import Service
from fedveil.server.coordinator.settings import settings_from_dict

PARTICIPATION_KEYS = ("drops_by_reason", "cohort_planned", "cohort_aggregated", "dropped")


def _round(r: int) -> dict[str, Any]:
    return {
        "round": r,
        "status": "applied",
        "applied": True,
        "cohort_planned": 4,
        "cohort_aggregated": 2,
        "dropped": 2,
        "drops_by_reason": {"norm_bound": 1, "nan_coordinates": 1},
        "test_loss": 1.0 / r,
        "test_accuracy": 0.5,
        "epsilon": 0.5 * r,
    }


def _write_run(state: Path, rid: str, dp: bool, leaky: bool = False) -> None:
    run = state / "runs" / rid
    run.mkdir(parents=True)
    (run / "run.json").write_text(
        json.dumps({"id": rid, "name": rid, "status": "completed", "rounds": 2, "attempts": []})
    )
    mechanism = "central" if dp else "none"
    (run / "config.toml").write_text(f'[dp]\nmechanism = "{mechanism}"\nepsilon = 8.0\n')
    full = [_round(1), _round(2)]
    public = full
    if dp and not leaky:  # as the engine writes a DP run: counts only in the private annex
        public = [{k: v for k, v in r.items() if k not in PARTICIPATION_KEYS} for r in full]
        (run / "private").mkdir(mode=0o700)
        annex = [
            {**r, "cohort": [3, 5, 7, 9], "dropped_reasons": {"5": "norm_bound"}} for r in full
        ]
        annex.insert(1, {"kind": "charge", "round": 1, "clients": [3, 9]})
        (run / "private" / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in annex))
        (run / "privacy").mkdir()  # as write_privacy_report leaves them
        (run / "privacy" / "report.json").write_text(json.dumps({"epsilon": 1.0}))
        (run / "private" / "report.json").write_text(json.dumps({"noise_only_rounds": [2]}))
        (run / "private" / "report.html").write_text("<p>noise-only rounds: 2</p>")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in public))


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def api(state_dir: Path) -> Iterator[tuple[httpx.Client, str]]:
    state = state_dir
    token = secrets.token_urlsafe(24)
    old_env, old_umask = os.environ.get("FEDVEIL_ADMIN_TOKEN"), os.umask(0o022)
    os.environ["FEDVEIL_ADMIN_TOKEN"] = token
    try:
        service = Service(settings_from_dict({"state_dir": str(state)}, state, insecure=True))
    finally:
        os.umask(old_umask)  # the Service sets 077 for the coordinator process
        if old_env is None:
            del os.environ["FEDVEIL_ADMIN_TOKEN"]
        else:
            os.environ["FEDVEIL_ADMIN_TOKEN"] = old_env
    _write_run(state, "20260101-000000-aaaaaa", dp=True)
    _write_run(state, "20260101-000000-bbbbbb", dp=False)
    _write_run(state, "20260101-000000-cccccc", dp=True, leaky=True)
    _write_run(state, LONG_RUN, dp=False)
    long_rounds = [_round(r) for r in range(1, LONG_ROUNDS + 1)]
    (state / "runs" / LONG_RUN / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in long_rounds)
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_api(service), host="127.0.0.1", port=port, log_level="error")
    )
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "API did not start"
        time.sleep(0.05)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield client, token
    server.should_exit = True
    os.close(service._state_lock)


DP_RUN, PLAIN_RUN = "20260101-000000-aaaaaa", "20260101-000000-bbbbbb"
LEAKY_RUN = "20260101-000000-cccccc"
LONG_RUN, LONG_ROUNDS = "20260101-000000-dddddd", 2500


def test_dp_public_views_carry_no_participation_counts(api):
    http, _ = api
    for rid in (DP_RUN, LEAKY_RUN):  # LEAKY_RUN: counts in its public file by mistake
        for path in (f"/runs/{rid}/rounds", f"/runs/{rid}"):
            response = http.get(path)
            assert response.status_code == 200, path
            for key in (*PARTICIPATION_KEYS, "norm_bound", "cohort", "dropped_reasons"):
                assert f'"{key}"' not in response.text, (path, key)
        assert len(http.get(f"/runs/{rid}/rounds").json()) == 2
        listed = next(r for r in http.get("/runs").json() if r["id"] == rid)
        assert not set(PARTICIPATION_KEYS) & set(listed)
        lines = [m for m in http.get("/metrics").text.splitlines() if f'run="{rid}"' in m]
        assert lines and not any("reason=" in m for m in lines)
        assert f'fedveil_client_dropouts_total{{run="{rid}"}} 0' in lines


def test_dp_operator_view_needs_the_admin_token(api):
    http, token = api
    assert http.get(f"/runs/{DP_RUN}/rounds/private").status_code == 401
    wrong = {"Authorization": "Bearer " + "x" * 32}
    assert http.get(f"/runs/{DP_RUN}/rounds/private", headers=wrong).status_code == 403
    ok = http.get(f"/runs/{DP_RUN}/rounds/private", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    rounds = ok.json()
    assert [r["round"] for r in rounds] == [1, 2]  # the charge record is not a round
    assert rounds[0]["drops_by_reason"] == {"norm_bound": 1, "nan_coordinates": 1}
    assert (rounds[0]["cohort_planned"], rounds[0]["cohort_aggregated"]) == (4, 2)
    assert rounds[0]["dropped"] == 2 and rounds[0]["cohort"] == [3, 5, 7, 9]


def test_without_dp_drop_reasons_are_public(api):
    http, _ = api
    rounds = http.get(f"/runs/{PLAIN_RUN}/rounds").json()
    assert rounds[1]["drops_by_reason"] == {"norm_bound": 1, "nan_coordinates": 1}
    assert rounds[1]["cohort_aggregated"] == 2 and rounds[1]["dropped"] == 2
    assert http.get(f"/runs/{PLAIN_RUN}/rounds", params={"since": 1}).json()[0]["round"] == 2
    text = http.get("/metrics").text
    assert (
        f'fedveil_client_dropouts_by_reason_total{{run="{PLAIN_RUN}",reason="norm_bound"}} 2'
        in text.splitlines()
    )


def test_the_operators_privacy_report_needs_the_admin_token(api):
    http, token = api
    admin = {"Authorization": f"Bearer {token}"}
    public = http.get(f"/runs/{DP_RUN}/privacy")
    assert public.status_code == 200, public.text
    assert "noise_only_rounds" not in public.text
    for fmt in ("json", "html"):
        url = f"/runs/{DP_RUN}/privacy/private?format={fmt}"
        assert http.get(url).status_code == 401
        got = http.get(url, headers=admin)
        assert got.status_code == 200 and "2" in got.text
    html = http.get(f"/runs/{DP_RUN}/privacy/private?format=html", headers=admin)
    assert "sandbox" in html.headers["content-security-policy"]
    missing = http.get(f"/runs/{PLAIN_RUN}/privacy/private", headers=admin)
    assert missing.status_code == 404


def test_rounds_come_a_page_at_a_time_and_the_whole_history_page_by_page(api, state_dir):
    """Every poll answered (and parsed) the whole run; now at most `limit` records
    (MAX_ROUNDS_PAGE by default) after `since`, and the history page by page."""
    http, token = api
    url = f"/runs/{LONG_RUN}/rounds"
    assert [r["round"] for r in http.get(url).json()] == list(range(1, 1001))
    got: list[dict[str, Any]] = []
    since = 0
    while True:
        page = http.get(url, params={"since": since, "limit": 700}).json()
        got += page
        if len(page) < 700:
            break
        since = page[-1]["round"]
    assert [r["round"] for r in got] == list(range(1, LONG_ROUNDS + 1))
    assert got[41] == _round(42)
    # Rounds appended since the last poll, and one still being written (not yet served).
    path = state_dir / "runs" / LONG_RUN / "metrics.jsonl"
    with path.open("a") as f:
        f.write(
            json.dumps(_round(LONG_ROUNDS + 1)) + "\n" + json.dumps(_round(LONG_ROUNDS + 2))[:9]
        )
    newer = http.get(url, params={"since": LONG_ROUNDS}).json()
    assert [r["round"] for r in newer] == [LONG_ROUNDS + 1]
    with path.open("a") as f:
        f.write(json.dumps(_round(LONG_ROUNDS + 2))[9:] + "\n")
    assert [r["round"] for r in http.get(url, params={"since": LONG_ROUNDS + 1}).json()] == [
        LONG_ROUNDS + 2
    ]
    # A resume rewrites the file (a new one in its place): it is read again.
    fresh = path.with_name("metrics.jsonl.tmp")
    fresh.write_text(
        "".join(json.dumps({**_round(r), "test_accuracy": 0.9}) + "\n" for r in (1, 2, 3))
    )
    os.replace(fresh, path)
    again = http.get(url).json()
    assert [(r["round"], r["test_accuracy"]) for r in again] == [(1, 0.9), (2, 0.9), (3, 0.9)]
    # The operator's view of a DP run pages the private annex, charge records left out.
    admin = {"Authorization": f"Bearer {token}"}
    private = f"/runs/{DP_RUN}/rounds/private"
    assert [r["round"] for r in http.get(private, params={"limit": 1}, headers=admin).json()] == [1]
    page = http.get(private, params={"since": 1, "limit": 1}, headers=admin).json()
    assert [r["round"] for r in page] == [2]


@pytest.mark.parametrize(
    ("params", "field"),
    [({"limit": 1001}, "limit"), ({"limit": 0}, "limit"), ({"since": -1}, "since")],
)
def test_a_page_out_of_range_is_refused_naming_the_parameter(
    api: tuple[httpx.Client, str], params: dict[str, int], field: str
) -> None:
    http, token = api
    admin = {"Authorization": f"Bearer {token}"}
    for url in (f"/runs/{PLAIN_RUN}/rounds", f"/runs/{PLAIN_RUN}/rounds/private"):
        response = http.get(url, params=params, headers=admin)
        assert response.status_code == 422, (url, response.text)
        body = response.json()
        assert body["field"] == field and f"{field} = {params[field]}" in body["detail"]
