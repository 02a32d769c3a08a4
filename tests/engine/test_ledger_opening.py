"""Every DP run opens its signed ledger before round 1 and shows devices a head they can
verify from the first request on: central DP (sync and async) and DP-SGD-only runs.

Each training request the engine sends goes through a device's own ledger check
(LedgerGuard, what `fedveil client` runs) before the in-process clients answer it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

import tiny_task
from fedveil.client.edge.ledger_guard import LedgerGuard
from fedveil.config import load_config
from fedveil.privacy.dp.ledger import OPEN, WITNESS_CONFIG_KEY, Ledger
from fedveil.privacy.dp.verify import verify_ledger
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import trains
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.privacy_report import write_privacy_report
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import ClientFailure, ReplySink, Transport
from fedveil.simulations.availability import AvailabilityModel
from fedveil.simulations.inprocess import InProcessTransport


class Witnessing:
    """Checks every training request as a device would, then passes it on."""

    def __init__(self, inner: Transport, cfg) -> None:
        self.inner, self.cfg = inner, cfg
        self.guard = LedgerGuard()
        self.heads: list[dict] = []

    def client_ids(self):
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        for request in requests.values():
            self.guard.check(1, self.cfg, request)  # raises LedgerRefusal
            if trains(request.kind, request.config):
                self.heads.append(json.loads(request.config[WITNESS_CONFIG_KEY]))
        return self.inner.exchange(requests, timeout_s)

    def close(self) -> None:
        self.inner.close()


def config(out, **extra):
    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 4,
        "server.rounds": 2,
        "out": str(out),
    }
    values.update(extra)
    return load_config(None, values)


CENTRAL = {"dp.mechanism": "central", "dp.epsilon": 50.0, "dp.noise_multiplier": 1.0}
ASYNC = {
    **CENTRAL,
    "server.mode": "async",
    "server.buffer": 2,
    "server.max_participations": 2,
    "dp.noise_multiplier": 2.0,
}
DISTRIBUTED = {
    "secagg.enabled": True,
    "dp.mechanism": "distributed",
    "dp.epsilon": 50.0,
    "server.per_round": 12,
    "server.sampling": "fixed",
}
DP_SGD_ONLY = {"client.dp_sgd_noise": 1.0, "client.dp_sgd_clip": 1.0}


def run(cfg):
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    store.clear()
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        witnessing = Witnessing(transport, cfg)
        engine = life.engine(witnessing, availability=AvailabilityModel.from_config(cfg))
        engine.run()
    return witnessing, store


@pytest.mark.parametrize(
    "extra",
    [CENTRAL, ASYNC, DISTRIBUTED, DP_SGD_ONLY],
    ids=["central", "async", "distributed", "dpsgd"],
)
def test_every_dp_request_carries_a_verifiable_head_from_round_1(tmp_path, extra):
    cfg = config(tmp_path / "run", **extra)
    witnessing, store = run(cfg)
    entries = Ledger(store.ledger_path).entries
    opening = entries[0]
    assert opening["kind"] == OPEN and opening["seq"] == 1
    assert opening["public_key"] and opening["plan"]["dp_sgd_noise"] == cfg.client.dp_sgd_noise
    assert all(e["opening"] == opening["hash"] for e in entries[1:])
    first = witnessing.heads[0]
    assert first["entry"]["seq"] == 1 and first["opening"] == opening, "round 1 shows the opening"
    assert all(h["opening"] == opening for h in witnessing.heads)
    assert witnessing.guard.pin(1).key_id == opening["key_id"]
    result = verify_ledger(store.ledger_path)
    assert result.ok and result.schema == "fedveil.dp.ledger/3", result.message


def test_a_dp_sgd_only_ledger_gets_a_report(tmp_path):
    cfg = config(tmp_path / "run", **DP_SGD_ONLY)
    _, store = run(cfg)
    kinds = [e["kind"] for e in Ledger(store.ledger_path).entries]
    assert kinds == ["open", "final"]
    report = write_privacy_report(store.path)
    assert report["ledger_opening"]["plan"]["dp_sgd_noise"] == 1.0
    assert report["verification"]["ok"] and report["rounds"] == 0


def test_privacy_report_exits_1_on_a_dp_sgd_only_ledger_that_fails_verification(tmp_path, capsys):
    """The holder of the run directory lowers the recorded DP-SGD noise: the command
    must not exit 0 on a report whose ledger failed its check."""
    from fedveil.cli import main

    cfg = config(tmp_path / "run", **DP_SGD_ONLY)
    _, store = run(cfg)
    lines = store.ledger_path.read_text().splitlines()
    opening = json.loads(lines[0])
    opening["plan"]["dp_sgd_noise"] = 0.01
    store.ledger_path.write_text("\n".join([json.dumps(opening), *lines[1:]]) + "\n")
    assert main(["privacy", "report", str(store.path)]) == 1
    report = json.loads((store.ledger_path.parent / "report.json").read_text())
    assert report["verification"]["ok"] is False
    capsys.readouterr()


def test_the_public_final_record_states_the_cap_without_failure_counts(tmp_path):
    # Every client fails (NaN data): the cap runs out with no update. The operator's
    # reason names the failures; the public ledger's final record only the cap.
    cfg = config(tmp_path / "run", **{**ASYNC, "server.max_participations": 1, "server.rounds": 6})
    task = tiny_task.make_nan(cfg)
    store = RunStore(cfg.out)
    life = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        engine = life.engine(transport, availability=AvailabilityModel.from_config(cfg))
        engine.run()
    assert "client failures" in (engine.stopped_reason or "")
    final = Ledger(store.ledger_path).entries[-1]
    assert final["kind"] == "final"
    assert "server.max_participations = 1 reached" in final["reason"]
    assert "failure" not in final["reason"] and "NaN" not in final["reason"], final["reason"]
