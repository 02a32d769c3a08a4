"""Rebuilding a served model from a run directory or a bare file, without its data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedveil.builtin_models import build_model
from fedveil.config import load_config
from fedveil.flat_model import FlatModel
from fedveil.server.serving.loading import load_model_file, load_run_model
from fedveil.server.serving.prediction_server import privacy_warnings
from fedveil.server.serving.versions import TrafficSplit, load_version
from fedveil.simulations.simulate_run import simulate


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits-run")
    overrides = {
        "data.dataset": "digits",
        "model.name": "mlp",
        "server.rounds": 1,
        "data.num_clients": 4,
        "server.per_round": 4,
        "eval.central_every": 0,
        "device": "cpu",
        "simulation.workers": 1,  # in process (fast tier): same result as workers
        "out": str(out),
    }
    simulate(load_config(None, overrides))
    return out


def test_run_model_is_the_trained_model(digits_run: Path) -> None:
    model, info = load_run_model(digits_run)
    assert (info.task, info.model, info.input_shape, info.num_classes) == (
        "digits/mlp",
        "mlp",
        (1, 8, 8),
        10,
    )
    # The reference: the engine's own reader of model.safetensors.
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10))
    flat.set(flat.load(str(digits_run / "model.safetensors")))
    assert info.parameters == flat.size
    x = torch.randn(7, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(x), flat.module.eval()(x))


def test_custom_task_model_from_its_task_function(tmp_path: Path) -> None:
    overrides = {
        "model.task": "tiny_task:make",
        "server.rounds": 1,
        "data.num_clients": 4,
        "server.per_round": 4,
        "eval.central_every": 0,
        "device": "cpu",
        "simulation.workers": 1,  # in process (fast tier): same result as workers
        "out": str(tmp_path),
    }
    simulate(load_config(None, overrides))
    # A custom task's model loads only with the task named by the user (it was loaded
    # because the file's metadata named it: issue 31).
    with pytest.raises(ValueError, match="names the custom task 'tiny_task:make'"):
        load_run_model(tmp_path)
    model, info = load_run_model(tmp_path, allowed_tasks=["tiny_task:make"])
    assert (info.model, info.input_shape, info.num_classes) == ("tiny_task:make", (8,), 3)
    assert model(torch.randn(2, 8)).shape == (2, 3)


def test_file_without_metadata_needs_task(tmp_path: Path) -> None:
    flat = FlatModel(build_model("cnn", (1, 28, 28), 10))
    bare = tmp_path / "bare.safetensors"
    flat.save(flat.get(), str(bare))
    with pytest.raises(ValueError, match=r"names no model.*--task"):
        load_model_file(bare)
    with pytest.raises(ValueError, match="lacks 'input_shape'"):
        load_model_file(bare, "cnn")
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        load_model_file(bare, "fashion-mnist/resnet")
    meta = {"input_shape": "[1, 28, 28]", "num_classes": "10"}
    flat.save(flat.get(), str(tmp_path / "m.safetensors"), metadata=meta)
    model, _ = load_model_file(tmp_path / "m.safetensors", "cnn")
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), flat.module.eval()(x))
    # The wrong model for the file's tensors is named, not a raw torch error.
    with pytest.raises(ValueError, match="lacks tensor"):
        load_model_file(tmp_path / "m.safetensors", "mlp")


def test_a_model_file_with_nan_weights_is_refused_at_load(tmp_path: Path) -> None:
    # A diverged run's model (or a changed file): every answer would be NaN.
    flat = FlatModel(build_model("mlp", (1, 8, 8), 10))
    weights = flat.get().clone()
    weights[17] = float("nan")
    meta = {"input_shape": "[1, 8, 8]", "num_classes": "10"}
    flat.save(weights, str(tmp_path / "nan.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match=r"nan.safetensors: tensor '.+' holds NaN or infinite"):
        load_model_file(tmp_path / "nan.safetensors", "mlp")


def test_dp_run_states_its_guarantee_and_public_serving_does_not_warn(tmp_path: Path) -> None:
    overrides = {
        "data.dataset": "digits",
        "model.name": "mlp",
        "server.rounds": 1,
        "data.num_clients": 20,
        "server.per_round": 10,
        "dp.mechanism": "central",
        "dp.epsilon": 5.0,
        "eval.central_every": 0,
        "device": "cpu",
        "simulation.workers": 1,  # in process (fast tier): same result as workers
        "out": str(tmp_path / "dp"),
    }
    simulate(load_config(None, overrides))
    dp = load_version(str(tmp_path / "dp"))
    assert dp.guarantee is not None and dp.guarantee.endswith("-DP (central_gaussian, dpa_rdp)")
    assert privacy_warnings(TrafficSplit([(dp, 1.0)]), public=True) == []
    # The same model file without its run's ledger beside it carries no stated guarantee.
    bare = tmp_path / "copy.safetensors"
    bare.write_bytes((tmp_path / "dp" / "model.safetensors").read_bytes())
    plain = load_version(str(bare), name="dp")
    assert plain.guarantee is None
    (warning,) = privacy_warnings(TrafficSplit([(plain, 1.0)]), public=True)
    assert "NO differential-privacy guarantee" in warning
    assert privacy_warnings(TrafficSplit([(plain, 1.0)]), public=False) == []
