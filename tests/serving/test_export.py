"""`fedveil export`: each format, loaded as its consumer loads it (torch.jit.load,
torch.export.load, an ONNX evaluator), answers as the trained model does on a batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from fedveil.builtin_models import build_model
from fedveil.cli import main
from fedveil.config import load_config
from fedveil.server.serving.model_export import ExportError, export_model, onnx_available
from fedveil.simulations.simulate_run import simulate

SHAPE = (1, 28, 28)
ATOL = 1e-5


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory holding the default CNN as a run writes it (weights away from init,
    so a model rebuilt without them would not match)."""
    run = tmp_path_factory.mktemp("cnn-run")
    torch.manual_seed(7)
    model = build_model("cnn", SHAPE, 10)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    meta = {
        "format": "pt",
        "task": "fashion-mnist/cnn",
        "model": "cnn",
        "dataset": "fashion-mnist",
        "input_shape": json.dumps(list(SHAPE)),
        "num_classes": "10",
        "round": "60",
    }
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(run / "model.safetensors"), metadata=meta)
    return run


def reference_outputs(run: Path, x: torch.Tensor) -> np.ndarray:
    """The way docs/how-to/export.md loads the model: build_model + load_state_dict."""
    model = build_model("cnn", SHAPE, 10)
    model.load_state_dict(load_file(str(run / "model.safetensors")))
    with torch.no_grad():
        return model.eval()(x).numpy()


def export(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(["export", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ["torchscript", "exported-program"])
def test_torch_exports_answer_as_the_model(
    cnn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, fmt: str
) -> None:
    out = tmp_path / f"cnn.{fmt}"
    written = export(capsys, str(cnn_run), "--format", fmt, "--out", str(out))
    assert written["path"] == str(out) and written["max_abs_diff"] <= ATOL
    x = torch.randn(9, *SHAPE, generator=torch.Generator().manual_seed(3))
    expected = reference_outputs(cnn_run, x)
    extra = {"fedveil.json": ""}
    if fmt == "torchscript":
        loaded = torch.jit.load(str(out), _extra_files=extra)
    else:
        loaded = torch.export.load(str(out), extra_files=extra).module()
    with torch.no_grad():
        got = loaded(x).numpy()
        single = loaded(x[:1]).numpy()  # the batch dimension is not frozen at export
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(single, expected[:1], atol=ATOL, rtol=0)
    meta = json.loads(extra["fedveil.json"])
    assert (meta["task"], meta["input_shape"], meta["round"]) == (
        "fashion-mnist/cnn",
        "[1, 28, 28]",
        "60",
    )


@pytest.mark.skipif(not onnx_available(), reason="needs onnx and onnxscript: fedveil[onnx]")
def test_onnx_export_answers_as_the_model(
    cnn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import onnx
    from onnx.reference import ReferenceEvaluator

    written = export(capsys, str(cnn_run), "--format", "onnx")
    out = cnn_run / "model.onnx"  # the default: beside the model
    assert written["path"] == str(out)
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto)
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["fedveil.task"] == "fashion-mnist/cnn"
    x = torch.randn(6, *SHAPE, generator=torch.Generator().manual_seed(4))
    got = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, reference_outputs(cnn_run, x), atol=ATOL, rtol=0)


@pytest.mark.skipif(onnx_available(), reason="onnx and onnxscript are installed")
def test_onnx_refused_with_what_to_install(cnn_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["export", str(cnn_run), "--format", "onnx"]) == 2
    assert "pip install 'fedveil[onnx]'" in capsys.readouterr().err


def test_missing_model_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["export", str(tmp_path), "--format", "torchscript"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "model.safetensors") in err and "no such file" in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_trained_custom_task_run_exports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A real (one-round) run of a custom task: its model comes from the task function."""
    run = tmp_path / "run"
    overrides = {
        "model.task": "tiny_task:make",
        "server.rounds": 1,
        "data.num_clients": 4,
        "server.per_round": 4,
        "eval.central_every": 0,
        "device": "cpu",
        "simulation.workers": 1,  # in process (fast tier): same result as workers
        "out": str(run),
    }
    simulate(load_config(None, overrides))
    from fedveil.server.serving.loading import load_run_model

    # The custom task is named, as a user must (issue 31: no import because a file says).
    model, _ = load_run_model(run, allowed_tasks=["tiny_task:make"])
    x = torch.randn(11, 8)
    with torch.no_grad():
        expected = model(x).numpy()
    for fmt in ("torchscript", "exported-program"):
        written = export(capsys, str(run), "--format", fmt, "--task", "tiny_task:make")
        path = Path(written["path"])
        assert path.parent == run
        if fmt == "torchscript":
            loaded = torch.jit.load(str(path))
        else:
            loaded = torch.export.load(str(path)).module()
        with torch.no_grad():
            np.testing.assert_allclose(loaded(x).numpy(), expected, atol=ATOL, rtol=0)


class PerExample(nn.Module):
    """Python control flow per example: a trace unrolls the loop to the example batch's
    size, and torch.export cannot branch on a tensor's value."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, *unused: torch.Tensor) -> torch.Tensor:
        rows = [self.lin(r) if float(r.sum()) > 0 else -self.lin(r) for r in x]
        return torch.stack(rows)


@pytest.mark.parametrize("fmt", ["torchscript", "exported-program"])
def test_export_that_does_not_reproduce_the_model_is_refused(tmp_path: Path, fmt: str) -> None:
    with pytest.raises(ExportError, match=r"shape|differs|fails on a batch|cannot capture"):
        export_model(PerExample(), (4,), fmt, tmp_path / "m")
    assert not (tmp_path / "m").exists()  # the faulty export is not left behind
