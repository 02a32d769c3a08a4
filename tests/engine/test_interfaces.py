"""The engine's declared interfaces: optional transport capabilities are Protocols, a
transport learns the model's size at construction, and one run lifecycle (restore,
truncate, save, report, summary) serves `fedveil simulate` and the deployed ServerApp."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from safetensors.torch import load_file

import tiny_task
from fedveil.config import load_config
from fedveil.flat_model import FlatModel
from fedveil.protocol.envelope import Envelope
from fedveil.server.coordinator.deploy_transport import DeployTransport
from fedveil.server.engine.aggregation import PlainChannel
from fedveil.server.engine.lifecycle import MODEL_FILE, RunLifecycle
from fedveil.server.engine.rounds import RoundEngine, initial_model
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.transport import (
    CentralEvaluator,
    ClientFailure,
    ReplySink,
    RoundReporter,
)
from fedveil.simulations.availability import AvailabilityModel, AvailabilityTransport
from fedveil.simulations.inprocess import InProcessTransport
from fedveil.simulations.sequential_clients import SequentialClients


def tiny_config(tmp_path, **extra):
    overrides = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 4,
        "server.rounds": 2,
        "out": str(tmp_path / "run"),
    }
    overrides.update(extra)
    return load_config(None, overrides)


class ReportingTransport:
    """A transport over an in-process lane that also reports and evaluates: both
    capabilities declared, as a third-party transport would."""

    def __init__(self, inner: InProcessTransport) -> None:
        self.inner = inner
        self.evaluated: list[int] = []

    def client_ids(self) -> Sequence[int]:
        return self.inner.client_ids()

    def exchange(
        self,
        requests: Mapping[int, Envelope],
        timeout_s: float | None,
        on_reply: ReplySink | None = None,
    ) -> dict[int, Envelope | ClientFailure]:
        return self.inner.exchange(requests, timeout_s)

    def round_report(self, round_num: int) -> Mapping[str, Any]:
        return {"transport_note": f"round {round_num}"}

    def evaluate_central(
        self, weights: torch.Tensor, round_num: int, batch_size: int
    ) -> tuple[float, float, int] | None:
        self.evaluated.append(round_num)
        return (0.25, 0.5, 300)

    def close(self) -> None:
        self.inner.close()


def test_capabilities_are_declared_protocols(tmp_path) -> None:
    cfg = tiny_config(tmp_path)
    task = tiny_task.make(cfg)
    with InProcessTransport(task) as transport:
        assert isinstance(transport, CentralEvaluator)
        assert not isinstance(transport, RoundReporter)
        wrapped = AvailabilityTransport(transport, AvailabilityModel(seed=1, dropout=0.1))
        assert isinstance(wrapped, CentralEvaluator) and isinstance(wrapped, RoundReporter)
    # The plain channel reports only a robust aggregator's bound check: nothing for the mean.
    plain = PlainChannel()
    assert isinstance(plain, RoundReporter) and plain.round_report(1) == {}
    deploy = DeployTransport(None, num_clients=3, model_size=10)  # type: ignore[arg-type]
    assert not isinstance(deploy, CentralEvaluator)


def test_the_engine_uses_the_declared_capabilities(tmp_path) -> None:
    cfg = tiny_config(tmp_path, **{"eval.central_every": 1})
    task = tiny_task.make(cfg)
    with InProcessTransport(task) as inner:
        transport = ReportingTransport(inner)
        engine = RoundEngine(cfg, task, transport)
        engine.run()
    assert transport.evaluated == [1, 2]
    assert [r.test_accuracy for r in engine.history] == [0.5, 0.5]
    assert [r.extra["transport_note"] for r in engine.history] == ["round 1", "round 2"]


def test_the_lifecycle_builds_the_model_first_and_the_engine_takes_it(tmp_path) -> None:
    cfg = tiny_config(tmp_path)
    task = tiny_task.make(cfg)
    run = RunLifecycle(cfg, task, RunStore(cfg.out))
    expected = FlatModel(initial_model(task, cfg.seed))
    assert run.model_size == expected.size
    # A transport gets the size at construction: nothing is set on it afterwards.
    deploy = DeployTransport(None, num_clients=12, model_size=run.model_size)  # type: ignore[arg-type]
    with InProcessTransport(task) as transport:
        engine = run.engine(transport)
    assert engine.model.size == deploy.model_size
    assert torch.equal(engine.weights, expected.get()), "the seed's model, bit for bit"


def test_lifecycle_resume_truncates_and_finish_writes_the_run_files(tmp_path) -> None:
    cfg = tiny_config(tmp_path)
    task = tiny_task.make(cfg)
    store = RunStore(cfg.out)
    store.clear()
    run = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        engine = run.engine(transport, resume=False)
        engine.run_round()  # round 1 checkpointed
    # A round that was recorded but never checkpointed (a crash between the two).
    store.append_metrics({"round": 2, "applied": True})
    assert [r["round"] for r in store.read_metrics()] == [1, 2]

    again = RunLifecycle(cfg, task, store)
    with InProcessTransport(task) as transport:
        engine = again.engine(transport)
        assert engine.round == 1, "restored from the checkpoint"
        assert [r["round"] for r in store.read_metrics()] == [1], "the lost round is dropped"
        summary = again.finish(engine, engine.run(), model_metadata={"task": task.name})
    assert [r["round"] for r in store.read_metrics()] == [1, 2]
    assert json.loads((store.path / "summary.json").read_text())["rounds"] == summary["rounds"]
    saved = load_file(str(store.path / MODEL_FILE))
    assert torch.equal(engine.model.vector_from(saved), engine.weights.cpu())


def test_the_lane_injects_its_trainer_into_the_runtime(tmp_path) -> None:
    lane = SequentialClients(tiny_task.make(tiny_config(tmp_path)))
    assert lane.runtime.trainer == lane._train
