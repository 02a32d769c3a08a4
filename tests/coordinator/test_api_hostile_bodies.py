"""Hostile bodies against the coordinator's HTTP API on loopback uvicorn (a Service not
started: no SuperLink, nothing is run). Each is answered 422 naming the field, never 500,
and the API goes on answering on the same connection."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from loopback_ports import free_port

from fedveil.server.coordinator.api import create_api
from fedveil.server.coordinator.service import Service
from fedveil.server.coordinator.settings import settings_from_dict

GOOD = {
    "seed": 1,
    "model": {"name": "mlp"},
    "data": {"num_clients": 4},
    "server": {"rounds": 2, "per_round": 2},
}
HUGE_INT = "9" * 5000  # past Python's 4,300-digit limit on int() from text


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Service]]:
    root: Path = tmp_path_factory.mktemp("api-hostile")
    token = secrets.token_urlsafe(24)
    old_env, old_umask = os.environ.get("FEDVEIL_ADMIN_TOKEN"), os.umask(0o022)
    os.environ["FEDVEIL_ADMIN_TOKEN"] = token
    try:
        service = Service(settings_from_dict({"state_dir": "state"}, root, insecure=True))
    finally:
        os.umask(old_umask)  # the Service sets 077 for the coordinator process
        if old_env is None:
            del os.environ["FEDVEIL_ADMIN_TOKEN"]
        else:
            os.environ["FEDVEIL_ADMIN_TOKEN"] = old_env
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_api(service), host="127.0.0.1", port=port, log_level="critical")
    )
    threading.Thread(target=server.run, daemon=True).start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "API did not start"
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as c:
            yield c, service
    finally:
        server.should_exit = True
        os.close(service._state_lock)


def _refused(client: httpx.Client, reply: httpx.Response, field: str, says: str) -> None:
    assert reply.status_code == 422, reply.text
    body = reply.json()
    assert body["field"] == field, body
    assert says in body["detail"], body
    # The same connection still answers (a 500 closes it).
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/toml", f"seed = 1\n[server]\nrounds = {HUGE_INT}\n"),
        ("application/json", f'{{"seed": 1, "server": {{"rounds": {HUGE_INT}}}}}'),
    ],
)
def test_an_integer_of_thousands_of_digits_is_422_not_500(api, content_type, body):
    client, service = api
    reply = client.post("/runs", content=body.encode(), headers={"Content-Type": content_type})
    _refused(client, reply, "body", "4300 digits")
    assert service.manager.run_ids() == []


def test_a_json_key_given_twice_is_refused_naming_it(api):
    # json.loads keeps the last one silently: a reviewer reading rounds = 2 would submit
    # a run of 500 rounds.
    client, service = api
    text = json.dumps(GOOD)[:-1] + ', "server": {"rounds": 500, "per_round": 2}}'
    reply = client.post(
        "/runs", content=text.encode(), headers={"Content-Type": "application/json"}
    )
    _refused(client, reply, "body", "'server' appears twice")
    assert service.manager.run_ids() == []


def test_an_enrollment_that_is_not_json_names_the_body(api):
    client, _ = api
    reply = client.post(
        "/clients", content=b'{"client_id": 1,', headers={"Content-Type": "application/json"}
    )
    _refused(client, reply, "body", "JSON")
