"""The coordinator and its devices as real processes on loopback.

One deployment (TLS, SuperNode authentication, admin token) with five clients
serves the whole module, in order: runs whose model equals the simulation's
(plain; secure aggregation + central DP); the dashboard in headless Chromium;
bad and unauthorized requests during a run, then the coordinator SIGKILLed
under that same run and restarted (it resumes and ends with the uninterrupted
model), and again under a central-DP run (every round released once, the
ledger verifies); a client killed mid-training plus a client sending garbage,
in the clear and under secure aggregation; a revoked
key; stopping runs; SIGTERM. The clients mix the ways a device brings data:
the task itself (0, 1) and local .npz, .csv and IDX files (2-4).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import tomllib
import torch
from deploy_task import write_big_file, write_client_file
from deployment_harness import TOKEN as TOKEN_TEXT
from deployment_harness import Deployment, run_toml, wait_for
from proctree import alive, start_time
from safetensors.torch import load, load_file

from fedveil.config import config_from_dict
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.simulate_run import simulate

# Above the module deployment's start (up to 2 x 90 s) plus a test's own waits (up to
# 120 + 240 s with a coordinator restart).
pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(900)]

CLIENTS = 5
DATA_FORMATS = {2: "npz", 3: "csv", 4: "idx"}

# Privacy variants of the end-to-end run: config tables added to the run and to its
# simulation twin. Secure aggregation and central DP are one variant: every secure-
# aggregation stage is one more Flower exchange (~3-6 s each here), so one run covers both.
SECAGG_CENTRAL_DP = (
    '[secagg]\nenabled = true\n[dp]\nmechanism = "central"\nepsilon = 50.0\nclip = 1.0\n'
)
PRIVACY_VARIANTS = [
    pytest.param("", id="plain"),
    pytest.param(SECAGG_CENTRAL_DP, id="secagg+central-dp"),
]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    dep = Deployment(root, clients=CLIENTS + 2)
    try:
        dep.start_server()
        for cid in range(CLIENTS + 2):
            dep.enroll(cid)
        for cid in range(CLIENTS):
            start_honest_client(dep, cid)
        wait_for(lambda: dep.connected() >= CLIENTS, 90, "five clients to connect")
        yield dep
    finally:
        dep.close()


def start_honest_client(dep: Deployment, cid: int) -> None:
    if cid in DATA_FORMATS:
        path = write_client_file(dep.root / "data", CLIENTS, cid, DATA_FORMATS[cid])
        dep.start_client(cid, "--data", str(path), "--task", "mlp")
    else:
        dep.start_client(cid, "--task", "deploy_task:make")


def simulated_model(toml: str, out) -> dict[str, torch.Tensor]:
    values = tomllib.loads(toml)
    values.pop("deploy")
    values["out"] = str(out)
    simulate(config_from_dict(values))
    return load_file(f"{out}/model.safetensors")


def downloaded_model(dep: Deployment, rid: str) -> dict[str, torch.Tensor]:
    r = dep.http.get(f"/runs/{rid}/model", headers=dep.admin)
    assert r.status_code == 200, r.text
    return load(r.content)


def assert_registered(dep: Deployment, rid: str, dp: bool) -> None:
    """The coordinator registered the completed run's final model; its card is served."""
    cards = [
        dep.http.get(f"/models/{m['name']}/versions/{v['version']}", headers=dep.admin).json()
        for m in dep.http.get("/models").json()
        for v in m["versions"]
    ]
    mine = [c for c in cards if Path(c["source"]["run_dir"]).name == rid]
    assert len(mine) == 1, cards
    model = dep.http.get(f"/runs/{rid}/model", headers=dep.admin).content
    assert mine[0]["source"]["model_sha256"] == hashlib.sha256(model).hexdigest()
    if dp:
        assert mine[0]["privacy"]["ledger"]["state"] == "final"
        assert mine[0]["client_data"] is None
    else:
        assert mine[0]["client_data"]["clients"] == CLIENTS


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("privacy", PRIVACY_VARIANTS)
def test_run_matches_the_simulation(deployment, tmp_path, privacy, capsys):
    dep = deployment
    rounds_n = 2 if privacy else 3
    toml = run_toml(
        rounds=rounds_n, clients=CLIENTS, per_round=CLIENTS, seed=7, name="e2e", tables=privacy
    )
    start = time.monotonic()
    rid = dep.submit(toml)
    run = dep.wait_status(rid, "completed", timeout=150)
    elapsed = time.monotonic() - start
    rounds = dep.rounds(rid)
    assert [r["round"] for r in rounds] == list(range(1, rounds_n + 1))
    if privacy:
        # Under DP the public rounds carry no counts (they reveal participation): the
        # operator's private annex has them.
        assert all(r["status"] == "applied" and "cohort_aggregated" not in r for r in rounds)
        assert "rounds_applied" not in run["summary"]
        private = RunStore(dep.state / "runs" / rid).read_private()
        counted = [p for p in private if "cohort" in p]
        assert len(counted) == rounds_n
        assert all(
            p["applied"] and p["cohort_aggregated"] == CLIENTS and p["dropped"] == 0
            for p in counted
        )
    else:
        assert all(
            r["applied"] and r["cohort_aggregated"] == CLIENTS and r["dropped"] == 0 for r in rounds
        )
        assert run["summary"]["rounds_applied"] == rounds_n
    assert run["summary"]["test_accuracy"] > 0.4
    assert_registered(dep, rid, dp=bool(privacy))
    simulated = simulated_model(toml, tmp_path / "sim")
    deployed = downloaded_model(dep, rid)
    if not privacy:
        assert_same_model(deployed, simulated)
    else:
        check_secagg_and_central_dp(dep, rid, rounds, tmp_path / "sim", deployed, simulated)

    metrics = dep.http.get("/metrics").text
    assert f'fedveil_rounds_completed_total{{run="{rid}"}} {rounds_n}' in metrics
    updates = 0 if privacy else CLIENTS * rounds_n  # the public /metrics shows no DP counts
    assert f'fedveil_client_updates_total{{run="{rid}"}} {updates}' in metrics
    assert "fedveil_clients_connected 5" in metrics
    assert f'fedveil_round_duration_seconds_count{{run="{rid}"}} {rounds_n}' in metrics
    sent = [m for m in metrics.splitlines() if m.startswith("fedveil_fleet_bytes_sent_total")]
    assert sent and float(sent[0].split()[-1]) > 10_000
    spec = dep.http.get("/openapi.json").json()
    for path in (
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/rounds",
        "/runs/{run_id}/model",
        "/runs/{run_id}/privacy",
        "/healthz",
        "/readyz",
        "/metrics",
        "/clients",
    ):
        assert path in spec["paths"], path
    # The run's view says DP and aborted rounds (issue 30), and `fedveil run logs`
    # prints the run's server log with the admin token, `flwr log`-style.
    assert run["dp"] == ("central" if privacy else "none") and run["rounds_aborted"] == 0
    assert run["model_version"] and run["model_version_error"] is None
    assert "/runs/{run_id}/logs" in spec["paths"]
    assert dep.http.get(f"/runs/{rid}/logs").status_code == 401  # admin only
    cli_logs(dep, rid, capsys)
    kind = "secagg + central DP" if privacy else "plain"
    print(f"\n[e2e {kind}] 5 clients, {rounds_n} rounds: {elapsed:.1f} s from submission")


def cli_logs(dep: Deployment, rid: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fedveil.cli.main import main

    api = ["--api", f"https://127.0.0.1:{dep.api_port}", "--ca", str(dep.certs / "ca.pem")]
    token = ["--token-file", str(dep.root / "admin.token")]
    capsys.readouterr()
    assert main(["run", "logs", rid, "--tail", "5", *api, *token]) == 0
    shown = capsys.readouterr().out.splitlines()
    whole = (dep.state / "runs" / rid / "server.log").read_text().splitlines()
    assert shown == whole[-5:] and len(shown) == 5
    assert main(["run", "logs", rid, "--tail", "0", *api, *token]) == 1  # out of range
    assert "tail = 0: must be in [1, 10000]" in capsys.readouterr().err


def check_secagg_and_central_dp(dep, rid, rounds, sim_dir, deployed, simulated) -> None:
    """The same accounting as the simulation, a verified ledger, sums that unmask, fresh noise."""
    sim_rounds = [json.loads(line) for line in (sim_dir / "metrics.jsonl").read_text().splitlines()]
    # Round 1 starts from the same model on both sides: the mean training loss travels
    # masked with the update, so equal losses mean the masked sums decoded correctly.
    # Under DP it is in the operator's private annex only, never in the public rounds.
    assert "train_loss" not in rounds[0]
    private = RunStore(dep.state / "runs" / rid).read_private()
    sim_private = RunStore(sim_dir).read_private()
    assert private[0]["train_loss"] == pytest.approx(sim_private[0]["train_loss"], abs=1e-4)
    log = (dep.state / "runs" / rid / "server.log").read_text()
    client_log = (dep.root / "client-0.log").read_text()
    assert "the update leaves masked" in client_log
    # The device pinned the run's ledger key from the signed opening record (issue 28).
    ledger = (dep.state / "runs" / rid / "privacy" / "ledger.jsonl").read_text()
    opening = json.loads(ledger.splitlines()[0])
    assert opening["kind"] == "open" and f"pinned ledger key {opening['key_id']}" in client_log
    assert not re.search(r"client \d+ dropped", log)
    for key in ("epsilon", "clip_norm", "noise_multiplier"):
        assert [r[key] for r in rounds] == pytest.approx([r[key] for r in sim_rounds], rel=1e-12)
    report = dep.http.get(f"/runs/{rid}/privacy").json()
    assert report["verification"]["ok"] and report["rounds"] == len(rounds)
    # The opening record, the releases and the final record.
    assert report["ledger_entries"] == len(rounds) + 2
    assert report["ledger_state"] == "final"
    assert report["epsilon"] == pytest.approx(rounds[-1]["epsilon"]) and report["epsilon"] <= 50
    html = dep.http.get(f"/runs/{rid}/privacy", params={"format": "html"})
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert "sandbox" in html.headers["content-security-policy"]
    assert f'fedveil_epsilon_spent{{run="{rid}"}}' in dep.http.get("/metrics").text
    # The noise is drawn fresh from the OS CSPRNG, so the models differ, by noise only.
    assert any(not torch.equal(deployed[k], simulated[k]) for k in deployed)
    assert all(bool(torch.isfinite(v).all()) for v in deployed.values())


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--ignore-certificate-errors",  # the test CA is not in Chromium's store; TLS: see test_certs
    "--window-size=1280,1500",
    "--virtual-time-budget=10000",
]


def chromium(dep: Deployment, tmp_path, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    url = f"https://127.0.0.1:{dep.api_port}/dashboard"
    return subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.skipif(
    not (shutil.which("chromium") or shutil.which("chromium-browser")),
    reason="needs Chromium (apt-get install -y chromium)",
)
def test_dashboard_in_headless_chromium(deployment, tmp_path):
    dep = deployment
    assert (
        dep.run(dep.http.get("/runs").json()[0]["id"])["rounds_completed"] >= 2
    )  # from the test above
    dom = chromium(dep, tmp_path, "--dump-dom").stdout
    assert 'data-loaded="1"' in dom and "data-error" not in dom
    points = dict(re.findall(r'id="chart-(\w+)"[^>]*data-points="(\d+)"', dom))
    newest = dep.rounds(dep.http.get("/runs").json()[0]["id"])

    def count(*keys: str) -> int:
        return sum(r.get(k) is not None for r in newest for k in keys)

    # The newest run is a DP run: its public rounds have no client losses or counts, and
    # the dashboard draws exactly what the public rounds hold.
    assert int(points["accuracy"]) == count("test_accuracy", "federated_accuracy") >= 2
    assert int(points["loss"]) == count("train_loss", "test_loss") >= 2
    assert int(points["clients"]) == count("clients_connected", "dropped", "cohort_aggregated")
    assert int(points["clients"]) >= 2
    assert int(points["privacy"]) == count("epsilon")
    assert "5 clients connected" in dom and "completed" in dom
    shot = tmp_path / "dashboard.png"
    chromium(dep, tmp_path, f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    blue = image.tobytes().count(bytes([0x25, 0x63, 0xEB]))  # the accuracy line's colour
    assert blue > 200, f"only {blue} pixels of the chart colour in the screenshot"
    shutil.copy(shot, dep.root / "dashboard.png")


class BusyRun:
    """A 4-round run that a test acts on while it runs, submitted as an operator would
    (`fedveil run submit busy.toml`). `running()` gives the run submitted last while it
    is still running short of its last round, else submits a new one and waits for its
    first round: the tests below share one run in file order, and each stands alone (in
    any order, or run by itself with -k)."""

    ROUNDS = 4

    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.toml = run_toml(
            rounds=self.ROUNDS, clients=CLIENTS, per_round=CLIENTS, seed=11, name="busy"
        )
        (dep.root / "busy.toml").write_text(self.toml)
        self.id: str | None = None

    def running(self) -> str:
        if self.id is not None:
            run = self.dep.run(self.id)
            if run["status"] == "running" and run["rounds_completed"] < self.ROUNDS:
                return self.id
        submitted = self.dep.cli("run", "submit", "busy.toml", "--json")
        assert submitted.returncode == 0, submitted.stderr
        self.id = json.loads(submitted.stdout)["id"]
        self.dep.wait_rounds(self.id, 1, timeout=90)
        return self.id


@pytest.fixture(scope="module")
def busy(deployment) -> BusyRun:
    return BusyRun(deployment)


def test_bad_requests_leave_a_running_run_alone(deployment, busy):
    dep = deployment
    rid = busy.running()
    good = run_toml(rounds=2, clients=CLIENTS, per_round=3, seed=1, name="x")
    toml = {"Content-Type": "application/toml"}

    r = dep.http.post("/runs", content=good, headers=toml)
    assert r.status_code == 401 and "Bearer" in r.headers["www-authenticate"]
    r = dep.http.post(
        "/runs", content=good, headers={**toml, "Authorization": "Bearer not-the-token-xxxxxxx"}
    )
    assert r.status_code == 403
    assert dep.http.post(f"/runs/{rid}/stop").status_code == 401
    assert dep.http.get(f"/runs/{rid}/model").status_code == 401
    assert dep.http.get("/clients").status_code == 401

    def rejected(body: str, field: str) -> None:
        r = dep.http.post("/runs", content=body, headers={**dep.admin, **toml})
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field, r.json()
        if "." in field:
            assert field in r.json()["detail"]

    rejected(good.replace("rounds = 2", "rounds = 0"), "server.rounds")
    rejected(good.replace("per_round = 3", "per_round = 30"), "server.per_round")
    rejected(good.replace("lr = 0.1", "lr = -1"), "client.lr")
    rejected(good + "\n[server2]\nx = 1\n", "server2")
    rejected(good.replace("[client]", "[client]\nbogus = 1"), "client.bogus")
    rejected(good.replace('task = "deploy_task:make"', 'task = "os:system"'), "model.task")
    rejected(
        good.replace("wait_for_clients = 3", "wait_for_clients = 99"), "deploy.wait_for_clients"
    )
    rejected("seed = [", "body")
    r = dep.http.post("/runs", content=b"\xff\xfe", headers={**dep.admin, **toml})
    assert r.status_code == 422 and r.json()["field"] == "body"
    r = dep.http.post("/runs", content="x" * 70_000, headers={**dep.admin, **toml})
    assert r.status_code == 413
    r = dep.http.post(
        "/clients", json={"client_id": 3, "public_key": "ssh-rsa AAAA"}, headers=dep.admin
    )
    assert r.status_code == 422 and r.json()["field"] == "public_key"
    r = dep.http.post("/clients", json={"client_id": -1, "public_key": "x"}, headers=dep.admin)
    assert r.status_code == 422 and r.json()["field"] == "client_id"
    assert dep.http.get("/runs/20990101-000000-abcdef").status_code == 404
    assert dep.http.get("/runs/..%2F..%2Fetc").status_code == 404
    assert dep.http.get("/runs/no-such-run/rounds").status_code == 404
    assert dep.http.post("/runs/no-such-run/stop", headers=dep.admin).status_code == 404

    # The Fleet port: only the Fleet API, bounded bodies, garbage refused.
    fleet = dep.http.base_url.copy_with(port=dep.fleet_port)
    with dep.http.__class__(base_url=fleet, verify=str(dep.certs / "ca.pem")) as f:
        assert f.post("/v1/control/list-runs", content=b"").status_code == 404
        assert f.post("/v1/runtime/acquire-task", content=b"").status_code == 404
        assert f.get("/v1/fleet/pull-messages").status_code == 404
        r = f.post(
            "/v1/fleet/push-messages",
            content=os.urandom(512),
            headers={"Content-Type": "application/protobuf"},
        )
        assert 400 <= r.status_code < 500
        assert f.post("/v1/fleet/push-object", content=b"\0" * (8_388_608 + 1)).status_code == 413

    run = dep.run(rid)
    assert run["status"] == "running" and run["error"] is None, run
    assert all(r["applied"] and r["cohort_aggregated"] == CLIENTS for r in dep.rounds(rid))
    metrics = dep.http.get("/metrics").text
    assert 'fedveil_api_requests_rejected_total{reason="unauthorized"}' in metrics
    assert 'fedveil_fleet_requests_rejected_total{reason="not_fleet"}' in metrics


def test_coordinator_killed_mid_run_resumes_and_finishes(deployment, busy, tmp_path):
    dep = deployment
    rid, toml = busy.running(), busy.toml  # the run the test above left running, or its own
    assert dep.run(rid)["rounds_completed"] < 4, "the run ended before it could be interrupted"
    kill_and_restart_coordinator(dep)
    # The uninterrupted run's model, computed while the devices reconnect (a wait on the
    # processes, mostly; a device whose download the kill cut short gives it up when the
    # restarted SuperLink says the old run is not running).
    uninterrupted = simulated_model(toml, tmp_path / "sim")
    run = dep.wait_status(rid, "completed", timeout=240)
    rounds = dep.rounds(rid)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]  # none lost, none twice
    assert all(r["applied"] and r["cohort_aggregated"] == CLIENTS for r in rounds)
    assert [a.get("outcome") for a in run["attempts"]] == ["interrupted", "completed"]
    assert run["summary"]["rounds_applied"] == 4
    # Neither the abuse nor the crash changed a thing: the uninterrupted run's model.
    assert_same_model(downloaded_model(dep, rid), uninterrupted)
    listing = dep.cli("run", "list")
    assert listing.returncode == 0 and f"{rid}  completed 4/4 rounds" in listing.stdout
    # `run status --wait` (as `run submit --wait` ends) says what the run came to: it
    # ended on "completed 4/4 rounds" alone, without the accuracy or the model's version.
    followed = dep.cli("run", "status", rid, "--wait")
    assert followed.returncode == 0, followed.stderr
    accuracy = run["summary"]["test_accuracy"]
    assert f"test accuracy {accuracy:.4f} (the server's own test set)" in followed.stderr
    assert f"model registered as {run['model_version']}" in followed.stderr, followed.stderr
    (dep.root / "wrong.token").write_text("not-the-admin-token-at-all\n")
    refused = dep.cli("run", "submit", "busy.toml", "--token-file", str(dep.root / "wrong.token"))
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr


def kill_and_restart_coordinator(dep: Deployment) -> None:
    superlink_pid = int((dep.state / "superlink.pid").read_text())
    started = start_time(superlink_pid)
    dep.stop_server(signal.SIGKILL)
    # The SuperLink dies with the coordinator, so its port and database are free again.
    # (Its pid with its start time: a later process may reuse the pid.)
    wait_for(
        lambda: started is None or not alive(superlink_pid, started),
        60,
        "the SuperLink to die",
    )
    dep.start_server()


def test_coordinator_killed_under_central_dp_releases_every_round_once(deployment):
    dep = deployment
    dp = '[dp]\nmechanism = "central"\nepsilon = 50.0\nclip = 1.0\n'
    rounds = 3  # killed after round 1: two rounds resumed, each released once
    toml = run_toml(
        rounds=rounds, clients=CLIENTS, per_round=CLIENTS, seed=13, name="dp", tables=dp
    )
    rid = dep.submit(toml)
    dep.wait_rounds(rid, 1, timeout=120)
    assert dep.run(rid)["rounds_completed"] < rounds, "the run ended before it could be interrupted"
    kill_and_restart_coordinator(dep)
    run = dep.wait_status(rid, "completed", timeout=240)
    assert [a.get("outcome") for a in run["attempts"]] == ["interrupted", "completed"]
    assert [r["round"] for r in dep.rounds(rid)] == list(range(1, rounds + 1))
    run_dir = dep.state / "runs" / rid
    ledger = [
        json.loads(line) for line in (run_dir / "privacy" / "ledger.jsonl").read_text().splitlines()
    ]
    releases = [e["round"] for e in ledger if e.get("kind", "release") == "release"]
    assert releases == list(range(1, rounds + 1))  # none lost or twice
    assert ledger[-1]["kind"] == "final"
    # The closing record binds the model the coordinator published (model_sha256).
    model = (run_dir / "model.safetensors").read_bytes()
    assert ledger[-1]["model_sha256"] == hashlib.sha256(model).hexdigest()
    verified = dep.cli("privacy", "verify", str(run_dir))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = dep.http.get(f"/runs/{rid}/privacy").json()
    assert report["verification"]["ok"] and report["rounds"] == rounds
    assert report["epsilon"] <= 50


@pytest.mark.parametrize("secagg", [False, True], ids=["plain", "secagg"])
def test_dropout_and_garbage_do_not_stop_a_round(deployment, secagg):
    dep = deployment
    # Client 5 answers with garbage; client 6 has so much local data that its training
    # is still running when it is SIGKILLed in round 1. Under secure aggregation both
    # drop at the masked-input stage, after sharing their keys: the round completes
    # through dropout recovery. Each variant's two devices come with new keys: the other
    # variant's, SIGKILLed, stay online at the SuperLink for up to a minute.
    variant = "secagg" if secagg else "plain"
    dep.reenroll(5, variant)
    dep.reenroll(6, variant)
    dep.start_client(5, script=dep.device_script(5, "garbage_client.py"))
    slow = write_big_file(dep.root / "data" / "big.npz", 400_000)
    dep.start_client(6, "--data", str(slow), "--task", "mlp")
    wait_for(lambda: dep.connected() >= 7, 60, "clients 5 and 6 to connect")
    toml = run_toml(
        rounds=2,
        clients=7,
        per_round=7,
        seed=5,
        name="dropout",
        # The honest five must beat the deadline even on a loaded machine (at 10 s one
        # missed it at load 10); client 6, killed mid-training, never answers.
        extra="round_timeout = 20.0\nmin_clients = 3",
        tables="[secagg]\nenabled = true\n" if secagg else "",
    )
    received = dep.root / "client-6" / "supernode.log"
    training = "Receiving: train.secagg_masked_input" if secagg else "Receiving: train.train "
    before = received.read_text().count(training)
    rid = dep.submit(toml)
    # The run waits for all seven clients before round 1, so that wait is not part of it.
    server_log = dep.state / "runs" / rid / "server.log"
    wait_for(
        lambda: "training from round 1" in server_log.read_text(), 240, "all 7 clients to answer"
    )
    wait_for(
        lambda: received.read_text().count(training) > before, 90, "client 6 to train in round 1"
    )
    time.sleep(0.5)
    dep.kill_client(6)  # SIGKILL in the middle of its local training
    dep.wait_rounds(rid, 1, timeout=120)
    # Round 1 waited its deadline for the dead device. The operator then revokes it: its
    # node, still listed online by the SuperLink (for up to 2 x 30 s of heartbeat patience),
    # is gone at once, and round 2 drops client 6 without waiting a deadline again.
    assert dep.http.delete("/clients/6", headers=dep.admin).status_code == 200
    run = dep.wait_status(rid, "completed", timeout=120)
    rounds = dep.rounds(rid)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:  # both rounds go on with the five honest clients
        assert r["applied"] and r["cohort_aggregated"] == 5 and r["dropped"] == 2, r
    assert run["summary"]["dropped_total"] == 4
    log = (dep.state / "runs" / rid / "server.log").read_text()
    assert "round 1: client 6 dropped: no reply before the deadline" in log
    # Revoked: its message could not be sent, or it was not connected or went offline.
    assert "round 2: client 6 dropped: " in log, log[-3000:]
    assert "round 2: client 6 dropped: no reply before the deadline" not in log
    if secagg:
        assert "client 5 dropped: " in log and "masked_vector" in log, log[-3000:]
        assert "aborted" not in log
    else:
        assert "client 5 dropped" in log and "NaN" in log
    dep.kill_client(5)


def test_revoked_client_is_refused(deployment):
    dep = deployment

    def online(cid: int) -> bool:
        rows = dep.http.get("/clients", headers=dep.admin).json()
        return next(c for c in rows if c["client_id"] == cid)["online"]

    assert online(1)
    r = dep.http.delete("/clients/1", headers=dep.admin)
    assert r.status_code == 200 and r.json()["revoked_at"]
    # The SuperLink now refuses the key: the device's SuperNode is turned away and exits;
    # the device keeps retrying with backoff, and keeps being refused.
    wait_for(lambda: not online(1), 30, "client 1 to be refused")
    wait_for(
        lambda: "SuperNode exited" in (dep.root / "client-1.log").read_text(),
        60,
        "client 1 to notice",
    )
    assert dep.clients[1].poll() is None  # the device process itself stays up
    rows = dep.http.get("/clients", headers=dep.admin).json()
    assert next(c for c in rows if c["client_id"] == 1)["revoked_at"]
    again = {"client_id": 0, "public_key": (dep.certs / "clients" / "client-0.pub").read_text()}
    assert dep.http.post("/clients", json=again, headers=dep.admin).status_code == 409


def test_stop_a_waiting_run_and_a_queued_one(deployment):
    dep = deployment
    # Needs seven clients (two are gone): it waits, and the next submission queues behind it.
    waiting = dep.submit(run_toml(rounds=2, clients=7, per_round=7, seed=2, name="waits"))
    queued = dep.submit(run_toml(rounds=2, clients=CLIENTS, per_round=3, seed=2, name="queued"))
    wait_for(lambda: dep.run(waiting)["phase"] == "waiting_for_clients", 60, "the run to wait")
    assert dep.run(queued)["status"] == "queued"
    assert dep.http.post(f"/runs/{queued}/stop", headers=dep.admin).json()["status"] == "stopped"
    r = dep.http.post(f"/runs/{waiting}/stop", headers=dep.admin)
    assert r.status_code == 200
    run = dep.wait_status(waiting, "stopped", timeout=60)
    assert run["rounds_completed"] == 0 and run["attempts"][-1]["outcome"] == "stopped"
    again = dep.http.post(f"/runs/{waiting}/stop", headers=dep.admin)
    assert again.status_code == 409 and "already stopped" in again.json()["detail"]


def test_sigterm_stops_devices_and_coordinator_cleanly(deployment):
    dep = deployment
    devices = list(dep.clients.items())
    for _, proc in devices:
        os.kill(proc.pid, signal.SIGTERM)
    for cid, proc in devices:  # each leaves the federation and stops its SuperNode
        log = dep.root / f"client-{cid}.log"
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)  # the device dumps its threads into its log
            time.sleep(2)
            pytest.fail(f"client {cid} ignored SIGTERM for 120 s:\n{log.read_text()[-6000:]}")
        assert code == 0, cid
        assert "stopped after" in log.read_text()
    dep.clients.clear()
    superlink = int((dep.state / "superlink.pid").read_text())
    started = start_time(superlink)
    proc = dep.server
    dep.stop_server(signal.SIGTERM, timeout=120)
    assert proc.returncode == 0
    assert started is None or not alive(superlink, started)  # not a later process's pid
    assert "coordinator stopped" in (dep.root / "server.log").read_text()
    assert TOKEN_TEXT not in (dep.root / "server.log").read_text()  # the secret never logged
    assert TOKEN_TEXT not in (dep.state / "logs" / "superlink.log").read_text()
