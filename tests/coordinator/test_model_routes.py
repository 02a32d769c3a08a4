"""GET /models and GET /models/{name}/versions/{v} on the coordinator's real API (a Service
that is not started: no SuperLink is needed to read the registry) over real uvicorn on
loopback. Two finished runs are registered as the coordinator registers a completed run;
an outside reader sees the cards without the server's paths, the admin token adds them."""

from __future__ import annotations

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
from registry_runs import tiny_run

from fedveil.server.coordinator.api import create_api
from fedveil.server.coordinator.model_versions import register_finished_run
from fedveil.server.coordinator.service import Service
from fedveil.server.coordinator.settings import settings_from_dict

DP_RUN, PLAIN_RUN = "20260101-000000-dddddd", "20260101-000000-eeeeee"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str, Path]]:
    state = tmp_path_factory.mktemp("state")
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
    records: dict[str, dict[str, Any]] = {}
    for rid, dp in ((DP_RUN, True), (PLAIN_RUN, False)):
        run = tiny_run(state / "runs" / rid, dp=dp)
        records[rid] = {"id": rid, "status": "completed"}
        register_finished_run(state, run, records[rid])
        register_finished_run(state, run, records[rid])  # once per run, however often called
    assert records[DP_RUN]["model_version"] == "tiny-blobs@1"
    assert records[PLAIN_RUN]["model_version"] == "tiny-blobs@2"
    # A run retrained from a version (drift.py's record) is registered with its parent.
    retrained = {
        "id": "r",
        "status": "completed",
        "drift": {"kind": "retrain", "parent": "tiny-blobs@1"},
    }
    register_finished_run(state, state / "runs" / DP_RUN, retrained)
    assert retrained["model_version"] == "tiny-blobs@3"
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
        yield client, token, state
    server.should_exit = True
    os.close(service._state_lock)


@pytest.mark.procs
def test_models_and_version_cards(api: tuple[httpx.Client, str, Path]) -> None:
    http, token, state = api
    models = http.get("/models").json()
    assert [m["name"] for m in models] == ["tiny-blobs"]
    versions = models[0]["versions"]
    assert [(v["version"], v["dp"]) for v in versions][:2] == [
        (1, "central_gaussian"),
        (2, "none"),
    ]
    lineage = http.get("/models/tiny-blobs/versions/3").json()["lineage"]
    assert lineage["parent"] == "tiny-blobs@1"
    assert lineage["composed"]["observers"]["epsilon"] == 2 * versions[0]["epsilon"]
    assert versions[0]["epsilon"] > 0 and versions[1]["epsilon"] is None

    public = http.get("/models/tiny-blobs/versions/1")
    assert public.status_code == 200
    card = public.json()
    assert card["privacy"]["ledger"]["state"] == "final" and card["client_data"] is None
    assert str(state) not in public.text and "run_dir" not in card["source"]
    for key in ("clients", "per_round", "federated_accuracy", "cohort"):
        assert f'"{key}"' not in public.text, key
    admin = http.get(
        "/models/tiny-blobs/versions/1", headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert admin["source"]["run_dir"] == str((state / "runs" / DP_RUN).resolve())
    assert http.get("/models/tiny-blobs/versions/2").json()["client_data"]["clients"] == 6

    missing = http.get("/models/tiny-blobs/versions/7")
    assert missing.status_code == 404 and "tiny-blobs@7" in missing.json()["detail"]
    assert http.get("/models/nothing/versions/1").status_code == 404
    assert http.get("/models/tiny-blobs/versions/x").status_code == 422
