"""Rebuild a trained model from what a run leaves behind, without loading its data.

A run writes `model.safetensors` with metadata that names the model (see
`fedveil.server.engine.lifecycle.model_metadata`): a built-in model is
`fedveil.builtin_models.build_model(model, input_shape, num_classes)`, so neither the training
set nor the test set is read. A custom task's model (metadata `task_ref`) comes from
its task function, which builds whatever that task builds.

A model file never chooses code to run: the `task_ref` its metadata names is imported
only when the user named that same task (`allowed_tasks`: `fedveil serve --task
module:function`, the coordinator's runs.allowed_tasks), else loading is refused
saying how to allow it.

    load_run_model(RUN_DIR)            RUN_DIR/model.safetensors (+ RUN_DIR/config.toml)
    load_model_file(FILE, task=None)   a safetensors file; `task` when its metadata is
                                       missing or to override it
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from fedveil.builtin_models import MODELS, build_model
from fedveil.config import ConfigError, config_from_dict, load_config
from fedveil.server.engine.lifecycle import MODEL_FILE

CONFIG_FILE = "config.toml"


@dataclass(frozen=True)
class ModelInfo:
    """What a served or exported model is: enough to check inputs and describe it."""

    task: str  # the task's name, e.g. "fashion-mnist/cnn"
    model: str  # the built-in model's name, or the custom task's "module:function"
    input_shape: tuple[int, ...]  # one example's shape, without the batch dimension
    num_classes: int
    parameters: int  # number of float values in the model
    path: Path  # the safetensors file it was loaded from
    metadata: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "task": self.task,
            "model": self.model,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "parameters": self.parameters,
        }


def load_run_model(
    run_dir: Path, *, allowed_tasks: Collection[str] = ()
) -> tuple[nn.Module, ModelInfo]:
    """The final model of the run in `run_dir` (its model.safetensors), in eval mode; a
    custom task's only if it is in `allowed_tasks`."""
    run_dir = Path(run_dir)
    path = run_dir / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; a run writes its final model ({MODEL_FILE}) when it finishes"
        )
    data = path.read_bytes()
    meta = metadata_of(data, path)
    config = run_dir / CONFIG_FILE
    if "task_ref" in meta and "model" not in meta and not config.is_file():
        # A custom task: its function builds the model, with the run's own config.
        raise FileNotFoundError(
            f"{config}: no such file; a custom task's model ({meta['task_ref']}) is built by "
            f"its task function from the run's {CONFIG_FILE}"
        )
    return load_model_file(
        path, config=config if config.is_file() else None, allowed_tasks=allowed_tasks, data=data
    )


def load_model_file(
    path: Path,
    task: str | None = None,
    *,
    config: Path | None = None,
    allowed_tasks: Collection[str] = (),
    data: bytes | None = None,
) -> tuple[nn.Module, ModelInfo]:
    """A model from a safetensors file, in eval mode, read once.

    `task`, when given, names what to build instead of the file's metadata: a built-in
    model (`cnn`) or `DATASET/MODEL` (`fashion-mnist/cnn`; the input shape and classes
    come from the metadata, else from the dataset), or a custom task `module:function`.
    `config`: the run's config.toml, which a custom task's function is called with.
    `allowed_tasks`: custom tasks the user named; a file whose metadata names another is
    refused before anything is imported.
    `data`: the file's bytes, already read (a registry version's, checked against its
    card): the model is built from them and the file is not read again.
    """
    path = Path(path)
    if data is None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such model file")
        data = path.read_bytes()
    meta = metadata_of(data, path)
    if task is None:
        if "model" in meta:
            return _load(path, data, meta, model_name=meta["model"])
        if "task_ref" in meta:
            ref = meta["task_ref"]
            if ref not in allowed_tasks:
                raise ValueError(
                    f"{path}: its metadata names the custom task {ref!r}; a model file never "
                    "chooses code to import. If you trust that module, name it: "
                    f"--task {ref} (fedveil serve/export), or runs.allowed_tasks in "
                    "server.toml"
                )
            return _load(path, data, meta, task_ref=ref, config=config)
        raise ValueError(
            f"{path}: its metadata names no model (neither 'model' nor 'task_ref'); "
            "pass --task MODEL, DATASET/MODEL or module:function"
        )
    if ":" in task:
        return _load(path, data, meta, task_ref=task, config=config)
    dataset, _, name = task.rpartition("/")
    if name not in MODELS:
        raise ValueError(
            f"--task {task!r}: unknown model {name!r}; choose one of {sorted(MODELS)}, "
            "DATASET/MODEL, or a custom task as module:function"
        )
    if dataset and ("input_shape" not in meta or "num_classes" not in meta):
        meta = {**meta, **_dataset_shape(dataset)}
    return _load(path, data, meta, model_name=name)


def metadata_of(data: bytes, path: Path) -> dict[str, str]:
    """The text metadata of a safetensors file's bytes ({} when it has none), from its
    header (an 8-byte little-endian length, then JSON); a corrupt file is named."""
    length = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not (0 < length <= len(data) - 8):
        raise ValueError(f"{path}: not a readable safetensors file (header length {length})")
    try:
        header = json.loads(data[8 : 8 + length])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{path}: not a readable safetensors file (its metadata is not text)")
    return {str(k): v for k, v in meta.items()}


def _dataset_shape(dataset: str) -> dict[str, str]:
    """A built-in dataset's input shape and classes; only for a file without metadata,
    as it loads the dataset."""
    from fedveil.data.datasets import available_datasets, load_dataset

    if dataset not in available_datasets():
        raise ValueError(
            f"--task {dataset!r}/...: unknown dataset; choose one of {available_datasets()}"
        )
    ds = load_dataset(dataset)
    return {"input_shape": json.dumps(list(ds.input_shape)), "num_classes": str(ds.num_classes)}


def _shape(path: Path, meta: dict[str, str]) -> tuple[tuple[int, ...], int]:
    for key in ("input_shape", "num_classes"):
        if key not in meta:
            raise ValueError(
                f"{path}: metadata lacks {key!r}; pass --task DATASET/MODEL to take it "
                "from the dataset"
            )
    try:
        shape = tuple(int(v) for v in json.loads(meta["input_shape"]))
        classes = int(meta["num_classes"])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: metadata input_shape/num_classes unreadable ({exc})") from None
    return shape, classes


def _load(
    path: Path,
    data: bytes,
    meta: dict[str, str],
    *,
    model_name: str | None = None,
    task_ref: str | None = None,
    config: Path | None = None,
) -> tuple[nn.Module, ModelInfo]:
    if model_name is not None:
        shape, classes = _shape(path, meta)
        module = build_model(model_name, shape, classes)
        task_name = meta.get("task", f"{meta.get('dataset', '?')}/{model_name}")
        described = model_name
    else:
        assert task_ref is not None
        from fedveil.tasks import make_server_task

        cfg = (
            load_config(config, {"model.task": task_ref})
            if config is not None
            else config_from_dict({"model": {"task": task_ref}})
        )
        task = make_server_task(cfg)
        module = task.model_fn()
        shape, classes, task_name, described = (
            tuple(task.input_shape),
            task.num_classes,
            task.name,
            task_ref,
        )
    count = load_weights(module, data, path)
    module.eval()
    info = ModelInfo(task_name, described, shape, classes, count, path, meta)
    return module, info


def load_weights(module: nn.Module, data: bytes, path: Path) -> int:
    """Load the tensors of `data` (the safetensors file at `path`, already read) into
    `module` (every float parameter and buffer must be there, with its shape); the
    number of float values loaded."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from None
    expected = {
        name: t
        for name, t in [*module.named_parameters(), *module.named_buffers()]
        if t.is_floating_point()
    }
    for name, t in expected.items():
        if name not in tensors:
            raise ConfigError(f"{path}: lacks tensor {name!r} of the model")
        if tuple(tensors[name].shape) != tuple(t.shape):
            raise ConfigError(
                f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"the model's is {tuple(t.shape)}"
            )
        if not bool(torch.isfinite(tensors[name]).all()):
            # Every answer would be NaN (refused per request, 422): refused once, at load.
            raise ConfigError(f"{path}: tensor {name!r} holds NaN or infinite values")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise ConfigError(f"{path}: tensor {extra[0]!r} is not in the model (wrong --task?)")
    with torch.no_grad():
        for name, t in expected.items():
            t.copy_(tensors[name].to(t.dtype))
    return sum(math.prod(t.shape) for t in expected.values())
