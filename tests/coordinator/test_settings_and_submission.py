"""server.toml and submitted run configs: every refusal names the key at fault."""

from __future__ import annotations

import json
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from loopback_ports import free_port

from fedveil.config import ConfigError, config_from_dict, device_config, device_toml, load_config
from fedveil.server.coordinator.runs import RunManager, SubmissionError, parse_submission
from fedveil.server.coordinator.settings import settings_from_dict
from fedveil.server.engine.dp_from_config import plan_distributed_dp


def tls_files(tmp_path):
    for name in ("s.pem", "s.key", "ca.pem"):
        (tmp_path / name).write_text("x")
    return {"cert": "s.pem", "key": "s.key", "ca": "ca.pem"}


def test_tls_is_required_unless_insecure_is_explicit(tmp_path):
    with pytest.raises(ConfigError, match=r"tls\.cert is required.*--insecure"):
        settings_from_dict({}, tmp_path)
    s = settings_from_dict({}, tmp_path, insecure=True)
    assert s.tls.insecure and not s.client_auth and s.scheme == "http"
    s = settings_from_dict({"tls": tls_files(tmp_path), "state_dir": "st"}, tmp_path)
    assert not s.tls.insecure and s.client_auth and s.tls.cert == tmp_path / "s.pem"
    assert s.state_dir == tmp_path / "st" and s.superlink_address.startswith("127.0.0.1:")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"api": {"port": "80"}}, "api.port"),
        ({"api": {"port": 70000}}, "api.port"),
        ({"fleet": {"max_body_bytes": 10}}, "fleet.max_body_bytes"),
        ({"fleet": {"hots": "x"}}, "fleet.hots"),
        ({"auth": {"client_auth": "yes"}}, "auth.client_auth"),
        ({"runs": {"allowed_tasks": ["nocolon"]}}, "runs.allowed_tasks"),
        ({"runs": {"max_active": 0}}, "runs.max_active"),
        ({"statedir": "x"}, "statedir"),
        ({"api": {"port": 9000}, "fleet": {"port": 9000}}, "api.port"),
        ({"tls": {"cert": "missing.pem", "key": "s.key", "ca": "ca.pem"}}, "tls.cert"),
    ],
)
def test_bad_server_settings_name_the_key(tmp_path, raw, key):
    tls_files(tmp_path)
    raw = {"tls": tls_files(tmp_path), **raw}
    with pytest.raises(ConfigError) as err:
        settings_from_dict(raw, tmp_path)
    assert key in str(err.value)


GOOD = """seed = 1
[model]
name = "mlp"
[data]
num_clients = 4
[server]
rounds = 2
per_round = 2
[deploy]
name = "ok"
wait_for_clients = 2
"""


def submit(text: str, allowed=("deploy_task:make",), content_type="application/toml"):
    return parse_submission(text.encode(), content_type, list(allowed))


def test_a_good_submission_and_what_devices_see(tmp_path):
    cfg, deploy, _ = submit(
        GOOD.replace("seed = 1", 'seed = 1\nout = "/etc"\ntransport = "inprocess"')
    )
    assert cfg.server.rounds == 2 and deploy.name == "ok" and deploy.wait_for_clients == 2
    assert cfg.transport == "flower" and cfg.out == "runs/latest"  # the service decides both
    as_json = {"seed": 1, "data": {"num_clients": 4}, "server": {"per_round": 2}, "deploy": {}}
    cfg2, _, _ = submit(json.dumps(as_json), content_type="application/json")
    assert cfg2.data.num_clients == 4
    cfg3, _, _ = submit(GOOD.replace("num_clients = 4", 'num_clients = 4\ndata_dir = "/srv/data"'))
    shown = tomllib.loads(device_toml(cfg3))
    assert "data_dir" not in shown["data"] and "out" not in shown and "deploy" not in shown


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("rounds = 2", "rounds = 0"), "server.rounds"),
        (("rounds = 2", 'rounds = "two"'), "server.rounds"),
        (("per_round = 2", "per_round = 9"), "server.per_round"),
        (('name = "mlp"', 'name = "resnet"'), "model.name"),
        (('name = "mlp"', 'name = "mlp"\ntask = "os:system"'), "model.task"),
        (("[data]", "[data]\nfoo = 1"), "data.foo"),
        (("seed = 1", "seed = -1"), "seed"),
        (("seed = 1", "sede = 1"), "sede"),
        (("wait_for_clients = 2", "wait_for_clients = 5"), "deploy.wait_for_clients"),
        (("wait_for_clients = 2", "wait_for_clients = true"), "deploy.wait_for_clients"),
        (('name = "ok"', "name = 3"), "deploy.name"),
        (("[deploy]", "[deploy]\nretries = 3"), "deploy.retries"),
        (("seed = 1", "seed = ["), "body"),
    ],
)
def test_bad_submissions_name_the_field(edit, field):
    with pytest.raises(SubmissionError) as err:
        submit(GOOD.replace(*edit))
    assert err.value.field == field, str(err.value)


def test_empty_and_non_utf8_bodies():
    for body in (b"", b"  \n", b"\xff\xfe\x00"):
        with pytest.raises(SubmissionError) as err:
            parse_submission(body, "application/toml", [])
        assert err.value.field == "body"
    with pytest.raises(SubmissionError, match="table"):
        parse_submission(b"[1, 2]", "application/json", [])
    with pytest.raises(SubmissionError) as err:
        parse_submission(b'{"server": 3}', "application/json", [])
    assert err.value.field == "server"


# Secure aggregation needs at least 3 clients per round (and to wait for 3).
MALICIOUS = (
    GOOD.replace("per_round = 2", "per_round = 3")
    .replace("wait_for_clients = 2", "wait_for_clients = 3")
    .replace("[deploy]", '[secagg]\nenabled = true\nthreat = "malicious"\n[deploy]')
)


def test_a_malicious_mode_run_needs_a_server_roster(tmp_path):
    with pytest.raises(SubmissionError, match=r"\[secagg\] roster in server.toml") as err:
        submit(MALICIOUS)
    assert err.value.field == "secagg.threat"
    roster = tmp_path / "roster.json"
    cfg, _, _ = parse_submission(MALICIOUS.encode(), "application/toml", [], roster)
    assert cfg.secagg.threat == "malicious"


def test_the_server_roster_is_checked_at_start_up(tmp_path):
    raw = {"tls": tls_files(tmp_path), "secagg": {"roster": "roster.json"}}
    with pytest.raises(ConfigError, match=r"secagg\.roster = .*roster\.json"):
        settings_from_dict(raw, tmp_path)  # no such file
    (tmp_path / "roster.json").write_text('{"format": "fedveil-secagg-roster/1", "clients": []}')
    with pytest.raises(ConfigError, match="clients: must be an object"):
        settings_from_dict(raw, tmp_path)
    (tmp_path / "roster.json").write_text('{"format": "fedveil-secagg-roster/1", "clients": {}}')
    assert settings_from_dict(raw, tmp_path).secagg_roster == tmp_path / "roster.json"


class RecordingSuperLink:
    """The SuperLink as RunManager uses it, keeping what each run was started with."""

    def __init__(self):
        self.started: list[tuple[str, str]] = []

    def start_run(self, fedveil_run_id, client_config_toml):
        self.started.append((fedveil_run_id, client_config_toml))
        return len(self.started)

    def runs(self):
        return {}


DEPLOYED = GOOD.replace("per_round = 2", "per_round = 4").replace(
    "wait_for_clients = 2",
    "wait_for_clients = 4",  # distributed DP unmasks with >= 3
)
DEPLOYED = DEPLOYED.replace("[data]", '[data]\ndata_dir = "/srv/secret-data"').replace(
    "[deploy]",
    "[simulation]\nworkers = 3\ndropout = 0.2\n"
    '[dp]\nmechanism = "distributed"\nepsilon = 8.0\nnoise_multiplier = 1.5\n'
    "[secagg]\nenabled = true\n[deploy]",
)


def test_devices_receive_only_the_device_facing_config(tmp_path):
    settings = settings_from_dict({"state_dir": "state"}, tmp_path, insecure=True)
    link = RecordingSuperLink()
    view = RunManager(settings, link).submit(DEPLOYED.encode(), "application/toml")
    [(run_id, sent)] = link.started
    assert run_id == view["id"]
    received = tomllib.loads(sent)
    # What the in-process engine, the server's disk and the deployment are: not the device's.
    assert "simulation" not in received and "deploy" not in received
    assert not {"out", "device", "transport"} & set(received)
    assert "secret-data" not in sent and str(tmp_path) not in sent
    assert set(received["server"]) == {"rounds", "sampling", "per_round", "sample_rate"}
    assert received == device_config(config_from_dict(received))  # nothing lost on the way
    # The server keeps the whole config; the device's rebuilt one gives the same DP plan.
    server_cfg = load_config(settings.state_dir / "runs" / run_id / "config.toml")
    assert server_cfg.simulation.workers == 3 and server_cfg.data.data_dir == "/srv/secret-data"
    device_cfg = config_from_dict(received)
    assert plan_distributed_dp(device_cfg, 1000, 4) == plan_distributed_dp(server_cfg, 1000, 4)


def test_async_distributed_dp_is_refused_on_devices_naming_the_field():
    # A deployed async run runs on the wall clock, where distributed DP is not supported
    # (fedveil.config.async_dp.check_wall_clock_dp); central DP is accepted.
    text = GOOD.replace("per_round = 2", "per_round = 4").replace(
        "wait_for_clients = 2", "wait_for_clients = 3"
    )
    text = text.replace(
        "[deploy]",
        '[secagg]\nenabled = true\n[dp]\nmechanism = "distributed"\nepsilon = 8.0\n[deploy]',
    )
    text = text.replace(
        "rounds = 2\n",
        'rounds = 2\nmode = "async"\nbuffer = 3\ngroup_size = 3\nmax_participations = 2\n',
    )
    with pytest.raises(SubmissionError, match=r"on devices: refused") as err:
        submit(text)
    assert err.value.field == "dp.mechanism"
    cfg, _, _ = submit(text.replace('mechanism = "distributed"', 'mechanism = "central"'))
    assert cfg.server.mode == "async" and cfg.dp.mechanism == "central"


FEDERATED_EVAL = DEPLOYED.replace(
    "[deploy]", "[eval]\nfederated_every = 1\nclient_holdout = 0.2\n[deploy]"
)


def test_federated_evaluation_under_distributed_dp_is_refused_naming_the_field(tmp_path):
    # Each device's accuracy and loss would reach the coordinator in the clear, outside
    # the epsilon stated against it: refused before anything starts.
    with pytest.raises(SubmissionError, match=r"dp\.mechanism = 'distributed'") as err:
        submit(FEDERATED_EVAL)
    assert err.value.field == "eval.federated_every"
    settings = settings_from_dict({"state_dir": "state"}, tmp_path, insecure=True)
    link = RecordingSuperLink()
    manager = RunManager(settings, link)
    with pytest.raises(SubmissionError):
        manager.submit(FEDERATED_EVAL.encode(), "application/toml")
    assert link.started == [] and manager.run_ids() == []
    central = FEDERATED_EVAL.replace('mechanism = "distributed"', 'mechanism = "central"')
    cfg, _, _ = submit(central)
    assert cfg.dp.mechanism == "central" and cfg.eval.federated_every == 1


def test_post_runs_answers_422_naming_the_field(tmp_path):
    """The same refusal over the coordinator's real API (a Service not started: no
    SuperLink), on loopback uvicorn."""
    import os
    import secrets
    import threading
    import time

    import httpx
    import uvicorn

    from fedveil.server.coordinator.api import create_api
    from fedveil.server.coordinator.service import Service

    token = secrets.token_urlsafe(24)
    old_env, old_umask = os.environ.get("FEDVEIL_ADMIN_TOKEN"), os.umask(0o022)
    os.environ["FEDVEIL_ADMIN_TOKEN"] = token
    try:
        service = Service(settings_from_dict({"state_dir": "state"}, tmp_path, insecure=True))
    finally:
        os.umask(old_umask)  # the Service sets 077 for the coordinator process
        if old_env is None:
            del os.environ["FEDVEIL_ADMIN_TOKEN"]
        else:
            os.environ["FEDVEIL_ADMIN_TOKEN"] = old_env
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_api(service), host="127.0.0.1", port=port, log_level="error")
    )
    threading.Thread(target=server.run, daemon=True).start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "API did not start"
            time.sleep(0.05)
        reply = httpx.post(
            f"http://127.0.0.1:{port}/runs",
            content=FEDERATED_EVAL.encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/toml"},
            timeout=10,
        )
        assert reply.status_code == 422, reply.text
        body = reply.json()
        assert body["field"] == "eval.federated_every"
        assert "dp.mechanism = 'distributed'" in body["detail"] and "in the clear" in body["detail"]
        assert service.manager.run_ids() == []
    finally:
        server.should_exit = True
        os.close(service._state_lock)
