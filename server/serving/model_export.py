"""Export a trained model for serving outside fedveil: TorchScript, a torch.export
ExportedProgram, or ONNX (when `onnx` and `onnxscript` are installed: `fedveil[onnx]`).

Each export takes any batch size (the batch dimension is dynamic), carries the run's model
metadata (task, input_shape, num_classes, round), and is checked against the original model
on a fresh batch before it is reported written."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

FORMATS = ("torchscript", "exported-program", "onnx")
SUFFIX = {"torchscript": ".pt", "exported-program": ".pt2", "onnx": ".onnx"}
# Inputs and outputs are named so an ONNX runtime can feed them without reading the graph.
INPUT_NAME, OUTPUT_NAME = "inputs", "outputs"
# Exported at batch 2 and checked at batch 5: a batch of 1 would let torch.export specialise
# the dimension, and checking at another size catches a trace that froze the batch size.
EXAMPLE_BATCH, CHECK_BATCH = 2, 5
ATOL = 1e-5
ONNX_MISSING = (
    "--format onnx needs the packages onnx and onnxscript: pip install 'fedveil[onnx]' "
    "(or pip install onnx onnxscript)"
)


class ExportError(ValueError):
    """The export cannot be made or does not reproduce the model (the message says which)."""


@dataclass(frozen=True)
class ExportResult:
    path: Path
    format: str
    method: str  # how the graph was captured: script, trace, torch.export, dynamo-onnx
    input_shape: tuple[int, ...]
    max_abs_diff: float  # export vs model on CHECK_BATCH random inputs


def onnx_available() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript"))
    except (ImportError, ValueError):  # a module blocked in sys.modules
        return False


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if fmt == "onnx" and not onnx_available():
        raise ExportError(ONNX_MISSING)


def export_model(
    model: nn.Module,
    input_shape: tuple[int, ...],
    fmt: str,
    out: Path,
    metadata: dict[str, str] | None = None,
) -> ExportResult:
    """Write `model` (taking batches of `input_shape`) to `out` in format `fmt`, check the
    written file against the model and return what was written."""
    check_format(fmt)
    model = model.eval()
    meta = dict(metadata or {})
    meta.setdefault("input_shape", json.dumps(list(input_shape)))
    out.parent.mkdir(parents=True, exist_ok=True)
    example = torch.randn(EXAMPLE_BATCH, *input_shape, generator=torch.Generator().manual_seed(1))
    writer = {"torchscript": _torchscript, "exported-program": _exported_program, "onnx": _onnx}
    method = writer[fmt](model, example, out, meta)
    try:
        diff = _check(model, input_shape, out, fmt)
    except ExportError:
        out.unlink(missing_ok=True)  # an export that does not reproduce the model is not left
        raise
    return ExportResult(out, fmt, method, tuple(input_shape), diff)


def _check(model: nn.Module, input_shape: tuple[int, ...], out: Path, fmt: str) -> float:
    """The written file, loaded as a consumer loads it, against the model on a batch of
    another size than the example's: the largest absolute difference."""
    check = torch.randn(CHECK_BATCH, *input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(check).numpy()
    try:
        got = load_export(out, fmt)(check.numpy())
    except Exception as exc:  # e.g. a trace that froze the batch size fails at run time
        raise ExportError(f"{out}: the export fails on a batch of {CHECK_BATCH}: {exc}") from exc
    if got.shape != expected.shape:
        raise ExportError(f"{out}: export answers shape {got.shape}, the model {expected.shape}")
    diff = float(np.max(np.abs(got - expected))) if expected.size else 0.0
    if not diff <= ATOL:
        raise ExportError(f"{out}: export differs from the model by {diff:.3g} (allowed {ATOL})")
    return diff


def _torchscript(model: nn.Module, example: torch.Tensor, out: Path, meta: dict) -> str:
    """Scripting keeps the model's control flow; a model it cannot compile is traced."""
    try:
        module, method = torch.jit.script(model), "script"
    except Exception:  # TorchScript rejects many Python constructs; tracing takes them
        with torch.no_grad():
            module, method = torch.jit.trace(model, example), "trace"
    module.save(str(out), _extra_files={"fedveil.json": json.dumps(meta)})
    return method


def _batch_dim() -> dict[int, torch.export.Dim]:
    return {0: torch.export.Dim("batch", min=1, max=1 << 20)}


def _exported_program(model: nn.Module, example: torch.Tensor, out: Path, meta: dict) -> str:
    try:
        program = torch.export.export(model, (example,), dynamic_shapes=(_batch_dim(),))
    except Exception as exc:  # the message of torch.export says which construct failed
        raise ExportError(f"torch.export cannot capture the model: {exc}") from exc
    torch.export.save(program, str(out), extra_files={"fedveil.json": json.dumps(meta)})
    return "torch.export"


def _onnx(model: nn.Module, example: torch.Tensor, out: Path, meta: dict) -> str:
    import onnx

    try:
        torch.onnx.export(
            model,
            (example,),
            str(out),
            dynamo=True,
            dynamic_shapes=(_batch_dim(),),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            external_data=False,  # one file, as the other formats
            verbose=False,
        )
    except Exception as exc:
        raise ExportError(f"the ONNX exporter cannot convert the model: {exc}") from exc
    proto = onnx.load(str(out))
    for key, value in meta.items():
        proto.metadata_props.add(key=f"fedveil.{key}", value=value)
    onnx.save(proto, str(out))
    return "dynamo-onnx"


def load_export(path: Path, fmt: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function from a float32 batch to the export's outputs, as a consumer loads it:
    torch.jit.load, torch.export.load, or ONNX's reference evaluator (onnxruntime is
    faster and reads the same file)."""
    check_format(fmt)
    if not path.is_file():
        raise ExportError(f"{path}: no such export file")
    if fmt == "onnx":
        import onnx
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(onnx.load(str(path)))
        return lambda x: np.asarray(evaluator.run(None, {INPUT_NAME: x.astype(np.float32)})[0])
    if fmt == "torchscript":
        module = torch.jit.load(str(path))
    else:
        module = torch.export.load(str(path)).module()

    def run(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()

    return run


def export_metadata(path: Path, fmt: str) -> dict[str, str]:
    """The model metadata an export carries (what `export_model` was given)."""
    if fmt == "onnx":
        import onnx

        props = onnx.load(str(path), load_external_data=False).metadata_props
        return {
            p.key.removeprefix("fedveil."): p.value for p in props if p.key.startswith("fedveil.")
        }
    files = {"fedveil.json": ""}
    if fmt == "torchscript":
        torch.jit.load(str(path), _extra_files=files)
    else:
        torch.export.load(str(path), extra_files=files)
    return json.loads(files["fedveil.json"] or "{}")


def default_out(source: Path, fmt: str) -> Path:
    """Beside the model: RUN_DIR/model.pt, .pt2 or .onnx (a file's own directory for a file)."""
    folder = source if source.is_dir() else source.parent
    return folder / f"model{SUFFIX[fmt]}"


def export_run(
    source: Path, fmt: str, out: Path | None = None, task: str | None = None
) -> ExportResult:
    """Export the model of a run directory (its model.safetensors) or of a safetensors file,
    rebuilt as `fedveil serve` rebuilds it; `out` defaults to `default_out`."""
    from fedveil.server.serving.loading import load_model_file, load_run_model

    check_format(fmt)  # before loading: a missing exporter is said first
    source = Path(source)
    if source.is_dir():
        if task is not None and ":" not in task:
            raise ExportError(
                "--task applies to a run directory only as the custom task module:function "
                "it was trained with (a model file never chooses code to import)"
            )
        model, info = load_run_model(source, allowed_tasks=() if task is None else (task,))
    else:
        model, info = load_model_file(source, task)
    meta = {**info.metadata, "task": info.task, "model": info.model}
    meta.update(input_shape=json.dumps(list(info.input_shape)), num_classes=str(info.num_classes))
    meta.pop("format", None)  # safetensors' own convention, not the export's format
    return export_model(model, info.input_shape, fmt, out or default_out(source, fmt), meta)
