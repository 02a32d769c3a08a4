"""`fedveil simulate --aggregation allreduce`: silos in threads, no coordinator (issue 34)."""

from __future__ import annotations

import json

import pytest

from fedveil.cli import main
from fedveil.config import ConfigError, load_config
from fedveil.privacy.dp.ledger import Ledger

BASE = {
    "server.aggregation": "allreduce",
    "model.task": "tests.tiny_task:make",
    "data.num_clients": 4,
    "server.per_round": 4,
}


def _simulate(out, *extra: str) -> dict:
    argv = ["simulate", "--aggregation", "allreduce", "--task", "tests.tiny_task:make"]
    argv += ["--clients", "4", "--per-round", "4", "--out", str(out), "--quiet"]
    assert main([*argv, *extra]) == 0
    return json.loads((out / "summary.json").read_text())


def test_silos_train_together_without_a_coordinator(tmp_path):
    summary = _simulate(tmp_path, "--rounds", "3")
    assert summary["aggregation"] == "allreduce" and summary["rounds"] == 3
    assert summary["test_accuracy"] > 0.8  # the tiny task's blobs, learned from the sums
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["silos"] for m in lines] == [4, 4, 4]
    assert (tmp_path / "model.safetensors").is_file()


def test_distributed_dp_each_silo_signs_a_ledger_of_what_it_saw(tmp_path):
    summary = _simulate(
        tmp_path, "--rounds", "2", "--dp", "distributed", "--epsilon", "8",
        "--set", "secagg.dropout_rate=0.25", "--set", "secagg.adversarial_rate=0.25",
    )  # fmt: skip
    assert "holds against up to 1 colluding silos" in summary["trust_model"]
    ledgers = [Ledger(tmp_path / "silos" / str(s) / "ledger.jsonl") for s in range(4)]
    assert len({ledger.entries[0]["key_id"] for ledger in ledgers}) == 4  # one signer each
    for round_num in (1, 2):
        seen = [ledger.releases[round_num - 1] for ledger in ledgers]
        assert {e["silo"] for e in seen} == {0, 1, 2, 3}
        assert all(e["signature"] and e["members"] == [0, 1, 2, 3] for e in seen)
        assert len({e["sum_sha256"] for e in seen}) == 1  # all saw the same sum
        assert len({e["epsilon"] for e in seen}) == 1
        assert seen[0]["mechanism"] == "distributed_skellam"
        assert seen[0]["accountant"] == "skellam_rdp_integer"
        assert 0 < seen[0]["epsilon"] <= 8
    assert summary["epsilon"] == ledgers[0].releases[-1]["epsilon"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"dp.mechanism": "central", "dp.epsilon": 4.0}, "needs a coordinator"),
        ({"server.per_round": 2}, "every silo takes part in every round"),
        ({"server.optimizer": "fedadam"}, "server.optimizer = 'fedadam'"),
        ({"data.num_clients": 1, "server.per_round": 1}, "data.num_clients = 1 silos"),
    ],
)
def test_allreduce_refuses_what_needs_a_coordinator(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {**BASE, **extra})
