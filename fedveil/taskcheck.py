"""A custom task's contract, checked once before a run starts.

A task that breaks it would otherwise make every client fail in every round, with the
cause visible only in debug logs (or a worker process dying). So the task function's
signature, the Task it returns, one client's data and one forward pass plus the task's
own `loss_fn` on one batch are checked up front, and each error says what is wrong and
what is expected. Regression tasks pass: the loss is theirs, not cross-entropy's.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedveil.config import DataConfig, ModelConfig
from fedveil.task_types import ClientData, Task

if TYPE_CHECKING:
    from fedveil.config import RunConfig

EXPECTED_SIGNATURE = "def make(cfg: fedveil.config.RunConfig) -> fedveil.tasks.Task"


class TaskContractError(ValueError):
    """A custom task does not keep its contract (exit 2 from the command line)."""


def check_task_function(ref: str, func: Callable[..., Any]) -> None:
    """The function must be callable with one positional argument, the RunConfig."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        sig.bind(object())
    except TypeError:
        raise TaskContractError(
            f"model.task = {ref!r}: {getattr(func, '__name__', ref)}{sig} cannot be called "
            f"with the run config alone; expected {EXPECTED_SIGNATURE}"
        ) from None


def check_task(task: Any, ref: str, *, batch_size: int = 32, device: str = "cpu") -> None:
    """The Task's fields, client 0's data, and model + loss_fn on one batch of it.

    Torch's global generator is left as it was (model init and dropout draw from it), so
    a checked run trains the same model bit for bit as an unchecked one."""
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        _check_task(task, ref, batch_size, device)


def _check_task(task: Any, ref: str, batch_size: int, device: str) -> None:
    where = f"model.task = {ref!r}"
    if not isinstance(task, Task):
        raise TaskContractError(
            f"{where}: returned {type(task).__name__}, expected fedveil.tasks.Task"
        )
    _check_fields(task, where)
    data = task.client_data(0)
    if not isinstance(data, ClientData):
        raise TaskContractError(
            f"{where}: client_data(0) returned {type(data).__name__}, "
            "expected fedveil.tasks.ClientData(x, y)"
        )
    _check_tensors(where, "client_data(0)", data.x, data.y, task.input_shape)
    if len(data) == 0:
        raise TaskContractError(f"{where}: client_data(0) has no examples; expected at least one")
    if data.x_eval is not None or data.y_eval is not None:
        _check_tensors(where, "client_data(0) eval split", data.x_eval, data.y_eval, None)
    model = task.model_fn()
    if not isinstance(model, nn.Module):
        raise TaskContractError(
            f"{where}: model_fn() returned {type(model).__name__}, expected a torch.nn.Module"
        )
    model = model.to(device)
    n = min(batch_size, len(data))
    _check_batch(task, model, data.x[:n], data.y[:n], f"{where}: client 0's first batch", device)
    if task.test_data is not None:
        x, y = task.test_data
        _check_tensors(where, "test_data", x, y, task.input_shape)
        _check_batch(task, model, x[:n], y[:n], f"{where}: the test set's first batch", device)


def _check_fields(task: Task, where: str) -> None:
    shape = task.input_shape
    if not isinstance(shape, tuple) or not all(isinstance(s, int) and s > 0 for s in shape):
        raise TaskContractError(
            f"{where}: input_shape = {shape!r}; expected a tuple of positive ints (no batch)"
        )
    if not isinstance(task.num_clients, int) or task.num_clients < 1:
        raise TaskContractError(
            f"{where}: num_clients = {task.num_clients!r}; expected an int >= 1"
        )
    for name in ("model_fn", "client_data", "loss_fn"):
        if not callable(getattr(task, name)):
            raise TaskContractError(f"{where}: {name} is not callable")
    test = task.test_data
    if test is not None and not (isinstance(test, tuple) and len(test) == 2):
        raise TaskContractError(
            f"{where}: test_data is {type(test).__name__}; expected (x, y) tensors or None"
        )
    sizes = task.client_sizes
    if sizes is not None and len(sizes) != task.num_clients:
        raise TaskContractError(
            f"{where}: client_sizes has {len(sizes)} entries; expected num_clients = "
            f"{task.num_clients}"
        )


def _check_tensors(
    where: str, what: str, x: Any, y: Any, input_shape: tuple[int, ...] | None
) -> None:
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            hint = " (wrap it: torch.from_numpy(a))" if type(value).__module__ == "numpy" else ""
            raise TaskContractError(
                f"{where}: {what}.{name} is a {type(value).__module__}.{type(value).__name__}; "
                f"expected a torch.Tensor{hint}"
            )
    if x.shape[:1] != y.shape[:1]:
        raise TaskContractError(
            f"{where}: {what} has {x.shape[0]} inputs but {y.shape[0]} labels; "
            "expected one label per input"
        )
    if input_shape is not None and tuple(x.shape[1:]) != input_shape:
        raise TaskContractError(
            f"{where}: {what}.x has examples of shape {tuple(x.shape[1:])}; expected the "
            f"task's input_shape {input_shape}"
        )


def _check_batch(
    task: Task, model: nn.Module, x: torch.Tensor, y: torch.Tensor, where: str, device: str
) -> None:
    x, y = x.to(device), y.to(device)
    model.train()
    try:
        out = model(x)
    except Exception as exc:
        raise TaskContractError(
            f"{where}: the model's forward pass failed on inputs of shape {tuple(x.shape)} "
            f"({type(exc).__name__}: {exc}); expected model_fn() to accept input_shape "
            f"{task.input_shape} with a batch dimension"
        ) from None
    _check_logits(task, out, y, where)
    try:
        loss = task.loss_fn(out, y)
    except Exception as exc:
        raise TaskContractError(
            f"{where}: loss_fn(model(x), y) failed ({type(exc).__name__}: {exc}); outputs "
            f"{_describe(out)}, labels {_describe(y)}{_label_hint(task, y)}"
        ) from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TaskContractError(
            f"{where}: loss_fn returned {_describe(loss)}; expected a scalar tensor "
            "(the batch's mean loss)"
        )
    if not loss.requires_grad:
        raise TaskContractError(
            f"{where}: loss_fn's result does not depend on the model's parameters; expected "
            "a differentiable loss of the model's output"
        )
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TaskContractError(f"{where}: loss_fn returned {value}; expected a finite loss")
    model.zero_grad(set_to_none=True)


def _check_logits(task: Task, out: Any, y: torch.Tensor, where: str) -> None:
    """A classifier (integer labels, or the default cross-entropy) outputs one logit per
    class: (batch, num_classes). Cross-entropy accepts any width >= the largest label, so
    a wrong number of outputs would otherwise train silently."""
    classifier = task.loss_fn is torch.nn.functional.cross_entropy or not y.is_floating_point()
    if not classifier or not isinstance(out, torch.Tensor):
        return
    expected = (int(y.shape[0]), int(task.num_classes))
    if tuple(out.shape) != expected:
        raise TaskContractError(
            f"{where}: the model outputs {_describe(out)}; expected (batch, num_classes) = "
            f"{expected}: one logit per class, with num_classes = {task.num_classes}"
        )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} of shape {tuple(value.shape)}"
    return type(value).__name__


def _label_hint(task: Task, y: torch.Tensor) -> str:
    if task.loss_fn is torch.nn.functional.cross_entropy and y.is_floating_point():
        return (
            "; cross-entropy (the default loss_fn) expects integer class labels "
            "(torch.int64): convert them with y.long(), or give the Task a loss_fn of its "
            "own for regression"
        )
    return ""


# -- which settings a task reads ---------------------------------------------------
# A custom task brings its own data and model, so the [data] settings and model.name
# mean something only when the task reads them (tests/tiny_task.py reads
# data.num_clients; a task may build a registered model by model.name). Reads are
# recorded while the task function runs, and a setting given on the command line that
# the task never read is refused instead of silently ignored.


class _ReadingData(DataConfig):
    def __getattribute__(self, name: str) -> Any:
        _note(self, "data", name)
        return super().__getattribute__(name)


class _ReadingModel(ModelConfig):
    def __getattribute__(self, name: str) -> Any:
        _note(self, "model", name)
        return super().__getattribute__(name)


def _note(section: object, prefix: str, name: str) -> None:
    if not name.startswith("_"):
        object.__getattribute__(section, "_fedveil_reads").add(f"{prefix}.{name}")


def _reading(section: Any, cls: type, reads: set[str]) -> Any:
    copy = object.__new__(cls)
    copy.__dict__.update(section.__dict__)
    copy.__dict__["_fedveil_reads"] = reads
    return copy


def reading_config(cfg: RunConfig) -> tuple[RunConfig, set[str]]:
    """A copy of `cfg` whose [data] and [model] sections record the keys read from them
    (as 'data.num_clients', ...), and the set they record into."""
    reads: set[str] = set()
    data = _reading(cfg.data, _ReadingData, reads)
    model = _reading(cfg.model, _ReadingModel, reads)
    return dataclasses.replace(cfg, data=data, model=model), reads


def check_settings_read(
    ref: str, task: Task, reads: set[str], given: Mapping[str, str], num_clients: int
) -> None:
    """Refuse each command-line setting (key -> how it was given, e.g. '--clients 50')
    that the task did not honour: never read, or a population it does not have."""
    for key, how in given.items():
        if key in ("model.task", "data.num_clients"):  # the population is compared below
            continue
        if key not in reads:
            raise TaskContractError(
                f"{how}: the task {ref!r} does not use {key} (a custom task brings its own "
                "data and model); leave it out, or make the task read "
                f"cfg.{key} to honour it"
            )
    clients = given.get("data.num_clients")
    if clients is not None and task.num_clients != num_clients:
        raise TaskContractError(
            f"{clients}: the task {ref!r} has {task.num_clients} clients; expected "
            f"data.num_clients = {num_clients} (make the task build cfg.data.num_clients "
            "clients, or leave the flag out)"
        )
