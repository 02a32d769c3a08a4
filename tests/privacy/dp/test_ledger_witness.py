"""Devices keep the ledger heads they are shown: the store, the runtime hook, the edge wiring."""

import json
import stat

import pytest

import tiny_task
from fedveil.client.edge.device_app import EdgeClient, TaskSource
from fedveil.client.edge.edge import EdgeNode, EdgeOptions
from fedveil.client.edge.witness import WitnessStore
from fedveil.client.runtime import ClientRuntime
from fedveil.config import RunConfig
from fedveil.privacy.dp import DpConfig, Ledger, PrivacyBudget
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY, canonical_json
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.protocol.envelope import Envelope, MessageError


def heads(tmp_path, rounds=3):
    """The JSON heads a coordinator would send after each of `rounds` releases."""
    cfg = DpConfig(
        mechanism="central_gaussian",
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=0.1,
        rounds=rounds,
        delta=1e-5,
        budget_epsilon=10.0,
        accountant="rdp",
    )
    ledger = Ledger(tmp_path / "ledger.jsonl", run_id="run-7", signer=load_or_create_signer())
    budget, sent = PrivacyBudget(cfg), []
    for number in range(1, rounds + 1):
        budget.record_release(ledger, round_number=number, event=cfg.round_event(), clip_norm=1.0)
        sent.append(canonical_json(ledger.witness_head()))
    return sent


def test_distinct_heads_are_kept_in_a_private_file(tmp_path):
    sent = heads(tmp_path)
    store = WitnessStore(tmp_path / "state" / "witness")
    assert [store.record(head) for head in sent] == [True, True, True]
    assert [store.record(head) for head in sent] == [False, False, False]  # re-sent heads
    assert not WitnessStore(store.directory).record(sent[0])  # also after a restart
    path = store.path_for("run-7")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [head["seq"] for head in kept] == [1, 2, 3]
    assert kept == [json.loads(head) for head in sent]


@pytest.mark.parametrize(
    "change, field",
    [
        ({"run_id": "../../etc/passwd"}, "run_id"),
        ({"seq": 0}, "seq"),
        ({"hash": "00"}, "hash"),
        ({"signature": None}, "signature"),
    ],
)
def test_malformed_heads_are_refused(tmp_path, change, field):
    head = {**json.loads(heads(tmp_path, rounds=1)[0]), **change}
    store = WitnessStore(tmp_path / "witness")
    with pytest.raises(ValueError, match=field):
        store.record(json.dumps(head))
    assert not store.directory.exists() or not any(store.directory.iterdir())
    with pytest.raises(ValueError, match="JSON"):
        store.record("{not json")


def test_the_runtime_hands_each_requests_head_to_its_hook(tmp_path):
    sent = heads(tmp_path, rounds=2)
    store = WitnessStore(tmp_path / "witness")
    runtime = ClientRuntime(tiny_task.make(RunConfig()), on_ledger_head=store.record)
    for number, head in enumerate(sent, start=1):
        runtime.handle(0, Envelope("hello", number, {WITNESS_CONFIG_KEY: head}), {})
    runtime.handle(0, Envelope("hello", 3, {}), {})  # no head: nothing to keep
    assert [head["seq"] for head in store.heads("run-7")] == [1, 2]
    with pytest.raises(MessageError, match="seq"):
        bad = {**json.loads(sent[0]), "seq": -1}
        runtime.handle(0, Envelope("hello", 4, {WITNESS_CONFIG_KEY: json.dumps(bad)}), {})


def test_the_edge_node_wires_the_state_dirs_witness_store(tmp_path):
    edge = EdgeClient(TaskSource("tiny_task:make"), 0)
    assert edge.ledger_guard.store is None  # pins in memory until an edge node runs it
    opts = EdgeOptions(server="127.0.0.1:9092", client_id=0, state_dir=tmp_path, insecure=True)
    EdgeNode(opts, edge)
    store = edge.ledger_guard.store
    assert store is not None and store.directory == tmp_path / "witness"
