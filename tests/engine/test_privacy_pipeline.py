"""Secure aggregation and DP running inside the round engine, on the tiny task."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import tiny_task
from fedveil.config import load_config
from fedveil.privacy.dp import Ledger
from fedveil.server.coordinator.publication import run_is_dp
from fedveil.server.engine.pipeline import make_privacy_pipeline
from fedveil.server.engine.round_record import PUBLIC_UNDER_DP
from fedveil.server.engine.rounds import RoundEngine
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.attacks.membership import dp_claim
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.simulate_run import simulate
from fedveil.tasks import ClientData

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast


def config(tmp_path, name="run", **overrides):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 3,
        "out": str(tmp_path / name),
    }
    values.update(overrides)
    return load_config(None, values)


def model(cfg):
    return load_file(f"{cfg.out}/model.safetensors")


def max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_secagg_gives_the_plain_model_within_quantization_error(tmp_path):
    plain = config(tmp_path, "plain")
    masked = config(tmp_path, "masked", **{"secagg.enabled": True})
    simulate(plain)
    simulate(masked)
    diff = max_diff(model(plain), model(masked))
    assert 0 < diff < 1e-4  # quantized (so not bit-equal), but within the rounding error


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.parametrize("threat", ["semi_honest", "malicious"])
def test_secagg_over_flower_matches_secagg_in_process(tmp_path, threat):
    on = {"secagg.enabled": True, "secagg.threat": threat, "server.rounds": 2}
    a = config(tmp_path, "a", **on)
    b = config(tmp_path, "b", transport="flower", **on)
    simulate(a)
    simulate(b)
    assert max_diff(model(a), model(b)) < 1e-4


def test_a_client_failing_mid_protocol_is_recovered_from(tmp_path):
    cfg = config(tmp_path, **{"secagg.enabled": True, "server.per_round": 12, "server.rounds": 1})
    task = tiny_task.make(cfg)
    honest = task.client_data

    def flaky(cid: int) -> ClientData:
        if cid == 4:
            raise RuntimeError("device went offline")
        return honest(cid)

    task.client_data = flaky
    privacy, channel = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    engine = RoundEngine(cfg, task, InProcessTransport(task), channel=channel, privacy=privacy)
    record = engine.run_round()
    assert record.applied and record.cohort_aggregated == 11 and record.dropped == 1


def test_central_dp_clips_every_client_update(tmp_path):
    cfg = config(tmp_path, **{"dp.mechanism": "central", "dp.epsilon": 5.0, "dp.clip": 0.05})
    task = tiny_task.make(cfg)
    privacy, _ = make_privacy_pipeline(cfg, task, tmp_path / "ledger.jsonl")
    transport = InProcessTransport(task)
    engine = RoundEngine(cfg, task, transport, privacy=privacy)
    request = engine.train_request(1)
    replies = transport.exchange({c: request for c in range(12)}, None)
    for reply in replies.values():
        assert float(reply.arrays["delta"].norm()) <= 0.05
        assert reply.config["weight"] == 1.0


def test_central_dp_run_spends_at_most_its_budget_and_verifies(tmp_path):
    cfg = config(
        tmp_path,
        **{
            "dp.mechanism": "central",
            "dp.epsilon": 4.0,
            "server.sampling": "poisson",
            "server.rounds": 6,
        },
    )
    summary = simulate(cfg)
    assert summary["rounds"] == 6
    # z was calibrated from the budget: the run ends close to it, never above
    assert 0.9 * 4.0 <= summary["epsilon"] <= 4.0
    entries = Ledger(tmp_path / "run" / "privacy" / "ledger.jsonl").releases
    assert [e["round"] for e in entries] == [1, 2, 3, 4, 5, 6]
    assert all(e["epsilon"] <= 4.0 for e in entries)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["epsilon"] for m in metrics] == [e["epsilon"] for e in entries]
    report = json.loads((tmp_path / "run" / "privacy" / "report.json").read_text())
    assert report["epsilon"] == entries[-1]["epsilon"] and report["budget_epsilon"] == 4.0
    assert "<svg" in (tmp_path / "run" / "privacy" / "report.html").read_text()
    assert report["secure_aggregation"] == "off"
    assert any("saw each client's clipped update" in t for t in report["assumptions"]["trust"])


def test_the_report_says_how_updates_travelled(tmp_path):
    cfg = config(
        tmp_path,
        **{
            "dp.mechanism": "central",
            "dp.epsilon": 8.0,
            "server.rounds": 2,
            "secagg.enabled": True,
            "secagg.threat": "malicious",
        },
    )
    simulate(cfg)
    report = json.loads((tmp_path / "run" / "privacy" / "report.json").read_text())
    assert report["secure_aggregation"] == "malicious" and report["rounds"] == 2
    html = (tmp_path / "run" / "privacy" / "report.html").read_text()
    assert "malicious-server mode" in html and "roster" in html


def test_budget_stops_the_run_before_overspending(tmp_path):
    cfg = config(
        tmp_path,
        **{
            "dp.mechanism": "central",
            "dp.epsilon": 6.0,
            "dp.noise_multiplier": 1.0,
            "server.sampling": "poisson",
            "server.rounds": 50,
        },
    )
    summary = simulate(cfg)
    assert 1 <= summary["rounds"] < 50
    assert "privacy budget" in summary["stopped_reason"]
    assert summary["epsilon"] <= 6.0
    report = json.loads((tmp_path / "run" / "privacy" / "report.json").read_text())
    assert report["rounds"] == summary["rounds"]


def test_a_budget_too_small_for_one_round_still_gets_a_report(tmp_path):
    cfg = config(
        tmp_path, **{"dp.mechanism": "central", "dp.epsilon": 0.5, "dp.noise_multiplier": 0.5}
    )
    summary = simulate(cfg)
    assert summary["rounds"] == 0 and "privacy budget" in summary["stopped_reason"]
    report = json.loads((tmp_path / "run" / "privacy" / "report.json").read_text())
    assert report["epsilon"] == 0.0 and report["rounds"] == 0


def verify(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedveil.cli.main", "privacy", "verify", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_verify_fails_after_editing_one_ledger_byte(tmp_path):
    cfg = config(
        tmp_path, **{"dp.mechanism": "central", "dp.epsilon": 6.0, "server.sampling": "poisson"}
    )
    simulate(cfg)
    run = tmp_path / "run"
    assert verify(run).returncode == 0
    for name, edit in {
        "byte": lambda b: b.replace(b'"clip_norm":', b'"clip_norf":', 1),
        "truncated": lambda b: b[: b.rstrip(b"\n").rfind(b"\n") + 1],
        "reordered": lambda b: b"".join(
            [
                b.splitlines(keepends=True)[1],
                b.splitlines(keepends=True)[0],
                *b.splitlines(keepends=True)[2:],
            ]
        ),
    }.items():
        copy = tmp_path / name
        shutil.copytree(run, copy)
        ledger = copy / "privacy" / "ledger.jsonl"
        ledger.write_bytes(edit(ledger.read_bytes()))
        proc = verify(copy)
        assert proc.returncode == 1, name
        assert "FAIL" in proc.stderr


def test_distributed_dp_under_secagg_releases_and_verifies(tmp_path):
    cfg = config(
        tmp_path,
        **{
            "secagg.enabled": True,
            "dp.mechanism": "distributed",
            "dp.epsilon": 10.0,
            "data.num_clients": 40,
            "server.per_round": 10,
            "server.sampling": "poisson",
        },
    )
    summary = simulate(cfg)
    assert summary["dp"] == "distributed_skellam"
    assert 0 < summary["epsilon"] <= 10.0
    assert verify(tmp_path / "run").returncode == 0


def test_resume_after_a_crash_between_ledger_entry_and_checkpoint(tmp_path):
    # a fixed z, so every part of the interrupted run adds the same noise
    dp = {
        "dp.mechanism": "central",
        "dp.epsilon": 30.0,
        "dp.noise_multiplier": 2.0,
        "server.sampling": "poisson",
        "server.rounds": 4,
    }
    cfg = config(tmp_path, **dp)

    class Stop(Exception):
        pass

    def stop_after(n: int):
        def on_round(record) -> None:
            if record.round == n:
                raise Stop(f"stopped after round {n}")  # after the round's checkpoint

        return on_round

    with pytest.raises(Stop):
        simulate(cfg, on_round=stop_after(2))
    run = tmp_path / "run"
    assert verify(run).returncode == 3  # interrupted at round 2, resumable
    saved = (run / "checkpoint" / "state.pt").read_bytes()
    with pytest.raises(Stop):
        simulate(cfg, resume=True, on_round=stop_after(3))
    # the crash: round 3's release is in the ledger, its checkpoint never landed
    (run / "checkpoint" / "state.pt").write_bytes(saved)
    summary = simulate(config(tmp_path, **dp), resume=True)
    entries = Ledger(run / "privacy" / "ledger.jsonl").releases
    assert [e["training_round"] for e in entries] == [1, 2, 3, 4]  # no round released twice
    assert summary["rounds"] == 4
    assert verify(run).returncode == 0
    assert torch.isfinite(model(config(tmp_path, **dp))["0.weight"]).all()


def test_local_dp_sgd_publishes_nothing_that_identifies_a_client(tmp_path):
    """The observer of a DP-SGD-only run reads only accounted figures: no per-client
    epsilon (the busiest client's inverts to its exact n), no training loss, no counts;
    the simulation's per-client accounting stays in the operator's private annex."""
    cfg = config(tmp_path, **{"client.dp_sgd_noise": 1.0, "client.dp_sgd_clip": 1.0})
    summary = simulate(cfg)
    run = tmp_path / "run"
    public = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(public) == 3
    for record in public:
        assert set(record) <= PUBLIC_UNDER_DP
        assert "dp_sgd_epsilon_max" not in record and "train_loss" not in record
        assert "cohort_aggregated" not in record and "dropped" not in record
    assert "dp_sgd_epsilon_max" not in summary and "dropped_total" not in summary
    assert summary["dp_sgd_noise"] == 1.0
    assert json.loads((run / "summary.json").read_text()) == summary
    assert run_is_dp(run)  # the coordinator's API and /metrics filter it the same way
    private = RunStore(run).read_private()
    worst = [r["dp_sgd_epsilon_max"] for r in private]
    assert worst == sorted(worst) and worst[0] > 0  # composes over rounds, never shrinks
    assert all(r["train_loss"] is None for r in private)  # replies carry no loss
    # The membership attack's example-level claim is that private figure.
    assert dp_claim(cfg, summary, "example", run) == (worst[-1], cfg.dp.delta)
    assert torch.isfinite(model(cfg)["0.weight"]).all()
