"""`fedveil simulate --aggregation gossip` in the in-process engine (simulations/gossip/)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from fedveil.client.runtime import client_generator
from fedveil.client.training import LocalTraining, train_local
from fedveil.config import RunConfig, load_config
from fedveil.flat_model import FlatModel
from fedveil.privacy.dp.accounting import compute_epsilon
from fedveil.privacy.dp.events import PrivacyEvent
from fedveil.protocol import fields as F
from fedveil.protocol.envelope import Envelope
from fedveil.protocol.kinds import Kind
from fedveil.server.engine.privacy_report import verify_run
from fedveil.server.engine.requests import training_config
from fedveil.server.engine.sampling import CohortSampler
from fedveil.simulations.batched import BatchedTrainer
from fedveil.simulations.gossip.engine import GossipEngine
from fedveil.simulations.gossip.gossip_privacy import gossip_privacy_report
from fedveil.simulations.gossip.mixing import average
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.sequential_clients import plan_units
from fedveil.simulations.simulate_run import simulate
from fedveil.tasks import ClientData, make_task


def _cfg(tmp_path: Path, **extra: object) -> RunConfig:
    return load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.rounds": 3,
            "server.aggregation": "gossip",
            "gossip.topology": "ring",
            "gossip.spread_clients": 4,
            "simulation.workers": 1,
            "out": str(tmp_path / "run"),
            **extra,
        },
    )


def test_batched_training_from_each_clients_own_row() -> None:
    """vmap units train each client from its own starting model (gossip), as train_local."""
    torch.manual_seed(0)
    model = FlatModel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    )
    trainer = BatchedTrainer(model, torch.nn.functional.cross_entropy)
    data = [ClientData(torch.randn(20, 8), torch.randint(0, 3, (20,))) for _ in range(3)]
    starts = model.get().unsqueeze(0) + 0.1 * torch.randn(3, model.size)
    hp = LocalTraining(local_epochs=1, batch_size=8, lr=0.1, momentum=0.5)
    got = trainer.train(starts, data, hp, [client_generator(0, 1, c) for c in range(3)])
    for c, (d, result) in enumerate(zip(data, got, strict=True)):
        want = train_local(
            model,
            starts[c],
            d.x,
            d.y,
            hp,
            torch.nn.functional.cross_entropy,
            client_generator(0, 1, c),
        )
        assert torch.allclose(result.delta, want.delta, atol=1e-6)
    assert not torch.allclose(got[0].delta, got[1].delta)


def test_rows_of_one_stacked_tensor_share_a_unit() -> None:
    x = torch.zeros(6, 10)
    requests = [(c, Envelope(Kind.TRAIN, 1, {F.SEED: 0}, {F.MODEL: x[c]})) for c in range(6)]
    units = plan_units(requests, np.full(6, 30), set(), unit_size=32)
    assert [len(u) for u in units] == [6]
    separate = [
        (c, Envelope(Kind.TRAIN, 1, {F.SEED: 0}, {F.MODEL: x[c].clone()})) for c in range(6)
    ]
    assert [len(u) for u in plan_units(separate, np.full(6, 30), set(), unit_size=32)] == [1] * 6


def test_engine_trains_every_client_and_mixes(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    task = make_task(cfg)
    with InProcessTransport(task, "cpu", workers=1, unit_size=32, run_config=cfg) as transport:
        engine = GossipEngine(cfg, task, transport)
        assert engine.x.shape == (12, engine.model.size)
        half, trained, _ = engine.train(1, engine.x)
        assert trained == list(range(12))
        assert len({tuple(r[:4].tolist()) for r in half}) == 12  # each client its own model
        engine = GossipEngine(cfg, task, transport)
        engine.run(2)
    records = engine.history
    assert [r.round for r in records] == [1, 2]
    assert records[-1].client_updates == 24 and records[-1].clients_failed == 0
    assert records[-1].bytes_sent_per_node_max == 2 * engine.model.size * 4
    assert records[-1].test_accuracy is not None and records[-1].test_accuracy > 0.5


def test_randomized_gossip_trains_only_the_awake_clients(tmp_path: Path) -> None:
    """gossip.active = 3 of 12: each round 3 clients train; the average model moves by
    their updates alone (the mixing over their edges is doubly stochastic), and a ring
    client neither awake nor next to one keeps its model and sends nothing."""
    cfg = _cfg(tmp_path, **{"gossip.active": 3})
    task = make_task(cfg)
    awake = CohortSampler(12, "fixed", 3, 1.0, cfg.seed).sample()  # the engine's first draw
    with InProcessTransport(task, "cpu", workers=1, unit_size=32, run_config=cfg) as transport:
        engine = GossipEngine(cfg, task, transport)
        before = engine.x.clone()
        first = engine.run_round()
        trained, done, _ = GossipEngine(cfg, task, transport).train(1, before[awake], awake)
        assert done == [0, 1, 2]  # positions in `awake`: all three trained
        after = before.clone()
        after[awake] = trained
        assert torch.allclose(average(engine.x), average(after), atol=1e-6)
        assert not torch.allclose(average(engine.x), average(before), atol=1e-4)
        asleep = [i for i in range(12) if not {(i - 1) % 12, i, (i + 1) % 12} & set(awake)]
        assert asleep and torch.equal(engine.x[asleep], before[asleep])
        engine.run(2)
    assert first.clients_trained == 3 and first.client_updates == 3
    assert engine.history[-1].client_updates == 9 and engine.history[-1].clients_failed == 0
    model_bytes = engine.model.size * 4
    assert first.bytes_sent_total == model_bytes * sum(
        2 if i in awake else len({(i - 1) % 12, (i + 1) % 12} & set(awake)) for i in range(12)
    )


def test_simulate_gossip_writes_the_run_directory(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    summary = simulate(cfg)
    run = Path(cfg.out)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    for key in (
        "consensus_distance",
        "test_accuracy",
        "client_accuracy_min",
        "client_accuracy_max",
        "bytes_sent_per_node_mean",
    ):
        assert all(isinstance(r[key], float) for r in rows), key
    assert summary["aggregation"] == "gossip" and summary["client_updates"] == 36
    assert 0 < summary["spectral_gap"] < 1
    assert summary["bytes_sent_per_node"] == pytest.approx(
        sum(r["bytes_sent_per_node_mean"] for r in rows)
    )
    # The saved model is the consensus model: its test accuracy is the last round's.
    saved = load_file(str(run / "model.safetensors"))
    task = make_task(cfg)
    model = FlatModel(task.model_fn())
    from fedveil.model_evaluation import evaluate

    acc = evaluate(model, model.vector_from(saved), *task.test_data, task.loss_fn)[1]
    assert acc == pytest.approx(rows[-1]["test_accuracy"])
    assert {"consensus.png", "client_accuracy.png", "accuracy.png"} <= set(summary["plots"])
    report = json.loads((run / "privacy" / "gossip.json").read_text())
    assert report["client_dp_sgd"] is None
    assert report["against_a_neighbour"].startswith("none")
    assert "does not apply" in report["secure_aggregation"]
    assert "not reported" in report["network_dp"]
    assert 'aggregation = "gossip"' in (run / "config.toml").read_text()


def test_gossip_refuses_resume(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--resume with server\.aggregation = 'gossip'"):
        simulate(_cfg(tmp_path), resume=True)


def test_privacy_report_with_dp_sgd_accounts_each_client(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"client.dp_sgd_noise": 1.1, "client.batch_size": 8})
    sizes = [20, 40, 59]
    report = gossip_privacy_report(cfg, sizes, 5, [2, 2, 2])
    eps = report["client_dp_sgd"]["epsilon_per_client"]
    # The smallest client samples at the highest rate over as many epochs: the largest epsilon.
    want = compute_epsilon(
        [PrivacyEvent(1.1, 8 / 20, int(20 / 8) * 5)], 1e-5, report["client_dp_sgd"]["accountant"]
    )
    assert eps["max"] == pytest.approx(want)
    assert eps["min"] < eps["max"]
    assert f"{want:.4g}" in report["against_a_neighbour"]


def test_the_how_to_config_is_the_config(tmp_path: Path) -> None:
    from docs_pages import code_blocks, page

    (block,) = code_blocks(page("how-to/gossip-training.md"), "toml")
    path = tmp_path / "gossip.toml"
    path.write_text(block)
    cfg = load_config(path)
    assert cfg.server.aggregation == "gossip" and cfg.gossip == RunConfig().gossip


def test_gossip_with_dp_sgd_trains_through_opacus_and_reports_each_client(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        **{"data.num_clients": 6, "server.rounds": 1, "client.dp_sgd_noise": 1.0,
           "client.batch_size": 8},
    )  # fmt: skip
    simulate(cfg)
    run = Path(cfg.out)
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["clients_trained"] == 6
    assert row["train_loss"] is None  # a DP-SGD reply carries no loss
    report = json.loads((run / "privacy" / "gossip.json").read_text())
    dp = report["client_dp_sgd"]
    assert dp["noise_multiplier"] == 1.0 and dp["delta"] == cfg.dp.delta
    sizes = [int(s) for s in make_task(cfg).client_sizes]
    want = gossip_privacy_report(cfg, sizes, 1, [2] * 6)["client_dp_sgd"]["epsilon_per_client"]
    assert dp["epsilon_per_client"] == want
    assert 0 < want["min"] <= want["max"] < float("inf")
    # The signed ledger a coordinator's DP-SGD run keeps: opened with the plan, closed
    # after the last round, and `fedveil privacy verify` accepts it.
    entries = [
        json.loads(line) for line in (run / "privacy" / "ledger.jsonl").read_text().splitlines()
    ]
    assert [e["kind"] for e in entries] == ["open", "final"]
    assert entries[0]["plan"]["dp_sgd_noise"] == 1.0 and entries[1]["training_round"] == 1
    assert all(e.get("signature") for e in entries)
    # ... and it binds the consensus model the run publishes (model.safetensors).
    model = (run / "model.safetensors").read_bytes()
    assert entries[1]["model_sha256"] == hashlib.sha256(model).hexdigest()
    verified = verify_run(run)
    assert verified.ok and verified.status == "final", verified.message


def test_a_lane_trains_a_unit_of_rows_each_from_its_own_model(tmp_path: Path) -> None:
    """The in-process lane's vmap unit of gossip requests: each client starts from its
    own row (the old lane started every client of a unit from the first one's model)."""
    import dataclasses

    from fedveil.simulations.sequential_clients import SequentialClients

    cfg = _cfg(tmp_path)
    tiny = make_task(cfg)

    def equal_size(cid: int) -> ClientData:  # 20 examples each: one vmap unit
        data = tiny.client_data(cid)
        return ClientData(data.x[:20], data.y[:20])

    task = dataclasses.replace(tiny, client_data=equal_size, client_sizes=np.full(12, 20))
    lane = SequentialClients(task, "cpu", unit_size=32, run_config=cfg)
    assert lane.batcher is not None
    torch.manual_seed(1)
    rows = 0.3 * torch.randn(2, lane.runtime.model.size)
    config = training_config(cfg, None)
    unit = [(c, Envelope(Kind.TRAIN, 1, dict(config), {F.MODEL: rows[c]})) for c in range(2)]
    together = dict(lane.run_unit(unit))
    for cid, msg in unit:
        ((_, alone),) = lane.run_unit([(cid, msg)])
        torch.testing.assert_close(
            together[cid].tensor(F.DELTA), alone.tensor(F.DELTA), rtol=1e-4, atol=1e-5
        )


def test_the_multi_process_run_refuses_randomized_gossip(tmp_path: Path) -> None:
    """Its ranks wake every client; gossip.active is refused by name, before any process."""
    from fedveil.simulations.gossip.distributed import run_gossip_processes

    cfg = _cfg(tmp_path, **{"gossip.active": 3})
    with pytest.raises(ValueError, match=r"gossip\.active = 3"):
        run_gossip_processes(cfg, 2, tmp_path / "ranks")
