"""Client failures that speak: each drop counted under the check that failed, one log line
per round with the distinct reasons, and, under DP, the counts kept to the private annex."""

from __future__ import annotations

import json
import logging

import pytest

import tiny_task
from fedveil.config import load_config
from fedveil.server.engine.drops import drop_check, drops_by_reason, failure_summary
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.rounds import PUBLIC_UNDER_DP
from fedveil.server.engine.runstore import RunStore
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.tasks import ClientData

# Reasons as the transports, the reply checks and the protocol word them.
REASONS = [
    ("RuntimeError: expected target dtype Long but found Float", "client error: RuntimeError"),
    ("client error: RuntimeError: expected scalar type Long", "client error: RuntimeError"),
    ("error reply: torch.OutOfMemoryError: CUDA out of memory", "client error: OutOfMemoryError"),
    ("client error: ValueError: values: NaN among coordinates 0..9", "NaN among coordinates"),
    ("train message: array 'delta' contains NaN or Inf", "NaN or Inf in the update"),
    ("train message: array 'delta' has 3 values, expected 10", "wrong shape"),
    ("train message: array 'delta' has dtype torch.float64, not float32", "wrong dtype"),
    (
        "delta: largest |value| 3e+38 x weight 2 = 6e+38 is over 1.134e+38 (float32's "
        "largest / 3 updates summed): the sum would overflow",
        "update overflows the sum",
    ),
    ("no reply before the deadline", "timeout"),
    ("simulated straggler: reply after 2.31 s, deadline 1 s", "timeout"),
    ("no reply", "no reply"),
    (
        "gone since an earlier stage: simulated dropout at stage 'train' (p=0.5)",
        "simulated dropout",
    ),
    ("worker process 3 died (exit code -9)", "worker process died"),
    ("num_examples = 0: must be in [1, 10000000]", "num_examples"),
    ("loss = nan: must be finite", "loss"),
    ("reply is for round 2, this is round 3", "wrong round"),
    ("train message: missing field 'loss'", "missing field 'loss'"),
    (
        "client 7 rejected at masked_input: masked_input.masked_vector: values >= 2^32",
        "client rejected at masked_input",
    ),
    ("client 7: share_keys: bad signature", "share_keys"),
]


@pytest.mark.parametrize(("reason", "check"), REASONS)
def test_each_reason_is_counted_under_its_check(reason, check):
    assert drop_check(reason) == check


def test_checks_carry_no_client_ids_or_values():
    a = drop_check("client 3 rejected at unmask: unmask_shares.seed_owner_ids: not exactly")
    b = drop_check("client 11 rejected at unmask: unmask_shares.seed_owner_ids: not exactly")
    assert a == b and "3" not in a
    assert drop_check("timeout after 12 s") == drop_check("timeout after 7.5 s")


def test_the_summary_counts_distinct_reasons_and_hides_counts_and_ids_on_request():
    dropped = {
        5: "RuntimeError: expected target dtype Long but found Float",
        2: "RuntimeError: expected target dtype Long but found Float",
        9: "client 9 rejected at masked_input: values >= 2^32",
    }
    assert drops_by_reason(dropped) == {
        "client error: RuntimeError": 2,
        "client rejected at masked_input": 1,
    }
    counted = failure_summary(dropped, counts=True)
    assert counted.startswith("2 x RuntimeError: expected target dtype Long")
    assert "1 x client 9 rejected" in counted
    quiet = failure_summary(dropped, counts=False)
    assert "x " not in quiet and "9" not in quiet and "expected target dtype Long" in quiet
    assert len(failure_summary({1: "ValueError: " + "z" * 1000}, counts=True)) < 200


FAILURE = "expected target dtype Long, got torch.float32"


def failing_task(cfg, failing):
    """The tiny task with clients whose training raises (as float labels would)."""
    task = tiny_task.make(cfg)
    honest = task.client_data

    def client_data(cid: int) -> ClientData:
        if cid in failing:
            raise RuntimeError(FAILURE)
        return honest(cid)

    task.client_data = client_data
    return task


def run(tmp_path, failing, **overrides):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 12,
        "server.rounds": 2,
        "simulation.workers": 1,
        "out": str(tmp_path / "run"),
        **overrides,
    }
    cfg = load_config(None, values)
    task = failing_task(cfg, failing)
    store = RunStore(cfg.out)
    engine = RunLifecycle(cfg, task, store).engine(InProcessTransport(task))
    summary = engine.run()
    metrics = [json.loads(line) for line in store.metrics_path.read_text().splitlines()]
    return engine, summary, metrics, store


def test_every_client_failing_says_why_in_the_log_the_record_and_the_summary(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="fedveil"):
        engine, summary, metrics, _ = run(tmp_path, failing=set(range(12)))
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    failed = [line for line in lines if "clients failed" in line]
    assert failed == [
        f"round {n}: 12 of 12 clients failed: 12 x RuntimeError: {FAILURE}" for n in (1, 2)
    ]
    # One warning per round; per-client lines only with -v (info: the deployed server.log).
    assert not [line for line in lines if "dropped:" in line]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert f"round 1: client 0 dropped: RuntimeError: {FAILURE}" in info
    assert [m["drops_by_reason"] for m in metrics] == [{"client error: RuntimeError": 12}] * 2
    assert not any(r.applied for r in engine.history)
    assert summary["client_errors"] == {"client error: RuntimeError": 24}
    assert summary["first_client_error"] == f"RuntimeError: {FAILURE}"
    assert summary["rounds_applied"] == 0


def test_a_clean_run_has_no_client_errors(tmp_path):
    _, summary, metrics, _ = run(tmp_path, failing=set())
    assert [m["drops_by_reason"] for m in metrics] == [{}, {}]
    assert summary["client_errors"] == {} and summary["first_client_error"] is None


def test_under_dp_drop_counts_reach_only_the_private_annex(tmp_path, caplog):
    assert "drops_by_reason" not in PUBLIC_UNDER_DP
    dp = {"dp.mechanism": "central", "dp.epsilon": 8.0}
    with caplog.at_level(logging.DEBUG, logger="fedveil"):
        engine, summary, metrics, store = run(tmp_path, failing={1, 4, 7}, **dp)
    assert all("drops_by_reason" not in m and "dropped" not in m for m in metrics)
    private = [json.loads(line) for line in store.private_rounds_path.read_text().splitlines()]
    assert [p["drops_by_reason"] for p in private] == [{"client error: RuntimeError": 3}] * 2
    assert "client_errors" not in summary and "first_client_error" not in summary
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    failed = [line for line in warned if "clients failed" in line]
    # The distinct reason, without counts or client ids; the counts only at debug level.
    assert failed == [f"round {n}: clients failed: RuntimeError: {FAILURE}" for n in (1, 2)]
    shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [line for line in shown if "dropped:" in line]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("3 of 12 clients failed: 3 x RuntimeError" in line for line in debug)
    assert all(r.applied for r in engine.history)


def test_under_central_dp_a_round_without_updates_is_marked_noise_only_in_private(tmp_path):
    dp = {"dp.mechanism": "central", "dp.epsilon": 8.0, "server.rounds": 1}
    engine, _, metrics, store = run(tmp_path, failing=set(range(12)), **dp)
    # Central DP still releases (and charges) noise; the record says it carried no update,
    # so a caller can tell a run in which no client's update was ever applied.
    assert [(r.applied, r.extra.get("noise_only")) for r in engine.history] == [(True, True)]
    assert "noise_only" not in metrics[0]
    private = json.loads(store.private_rounds_path.read_text().splitlines()[0])
    assert private["noise_only"] is True
