"""Tasks: what is trained (model factory, per-client data, loss) and how it is found.

A built-in task pairs a registered model with a built-in dataset and
partitioner (`make_task`, for simulations); a deployed coordinator takes only
the dataset's test set, its clients being devices with their own data
(`make_server_task`). A user task is any function `module:function` taking the
RunConfig and returning a `Task`, so people plug in their own model, data and
loss without editing fedveil.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedveil.builtin_models import build_model
from fedveil.dataset_defaults import DATASET_DEFAULTS as DATASET_DEFAULTS
from fedveil.dataset_defaults import dataset_defaults as dataset_defaults
from fedveil.task_types import ClientData, Task  # the contract: users import it from here
from fedveil.taskcheck import check_task_function

if TYPE_CHECKING:
    from fedveil.config import RunConfig
    from fedveil.data.datasets import Dataset


class PartitionedData:
    """A dataset split between clients; a client's tensors are built when asked for.

    Nothing per client is cached, so memory does not grow with the population.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        parts: list[np.ndarray],
        *,
        holdout: float = 0.0,
        seed: int = 0,
        transform: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    ) -> None:
        self.x, self.y, self.parts = x, y, parts
        self.holdout, self.seed, self.transform = holdout, seed, transform

    def __call__(self, cid: int) -> ClientData:
        if not 0 <= cid < len(self.parts):
            raise IndexError(f"client id {cid} out of range [0, {len(self.parts)})")
        idx = torch.from_numpy(np.asarray(self.parts[cid], dtype=np.int64))
        x, y = self.x[idx], self.y[idx]
        if self.transform is not None:
            x = self.transform(x, cid)
        if self.holdout <= 0 or len(idx) < 2:
            return ClientData(x, y)
        n_eval = max(1, round(self.holdout * len(idx)))
        return ClientData(x[n_eval:], y[n_eval:], x[:n_eval], y[:n_eval])

    def sizes(self) -> np.ndarray:
        total = np.array([len(p) for p in self.parts], dtype=np.int64)
        if self.holdout <= 0:
            return total
        n_eval = np.maximum(1, np.round(self.holdout * total)).astype(np.int64)
        return np.where(total >= 2, total - n_eval, total)


# Each built-in dataset's own defaults: fedveil/dataset_defaults.py (torch-free, so that
# `fedveil --help` can show them without importing torch).


def _builtin_dataset(cfg: RunConfig) -> Dataset:
    from fedveil.data.datasets import load_dataset

    d = cfg.data
    params: dict[str, object] = {}
    if d.dataset == "synthetic":
        params = {
            "num_clients": d.num_clients,
            "alpha": d.synthetic_alpha,
            "beta": d.synthetic_beta,
        }
    return load_dataset(d.dataset, data_dir=d.data_dir, seed=cfg.seed, **params)


def builtin_task(cfg: RunConfig) -> Task:
    """Built-in dataset + partitioner + registered model."""
    from fedveil.data.partition import apply_writer_style, partition

    d = cfg.data
    ds = _builtin_dataset(cfg)
    labels = ds.y_train.numpy()
    transform = None
    natural = getattr(ds, "natural_partition", None)
    if natural is not None:
        parts = list(natural)
    else:
        part_params: dict[str, object] = {
            "dirichlet": {"alpha": d.alpha, "min_size": d.min_size},
            "shards": {"shards_per_client": d.shards_per_client},
            "lognormal": {"sigma": d.sigma},
        }.get(d.partition, {})
        parts = partition(labels, d.num_clients, d.partition, cfg.seed, **part_params)
        if d.partition == "writer":
            seed = cfg.seed

            def transform(x: torch.Tensor, cid: int) -> torch.Tensor:
                return apply_writer_style(x, cid, seed)

    data = PartitionedData(
        ds.x_train,
        ds.y_train,
        parts,
        holdout=cfg.eval.client_holdout,
        seed=cfg.seed,
        transform=transform,
    )
    input_shape = tuple(ds.input_shape)
    name = cfg.model.name
    build_model(name, input_shape, ds.num_classes)  # fail now, not in round 1
    return Task(
        name=f"{d.dataset}/{name}",
        input_shape=input_shape,
        num_classes=ds.num_classes,
        num_clients=len(parts),
        model_fn=lambda: build_model(name, input_shape, ds.num_classes),
        client_data=data,
        test_data=(ds.x_test, ds.y_test),
        client_sizes=data.sizes(),
        info={"labels": labels, "parts": parts},
    )


def _find_in_cwd(module_name: str) -> None:
    """A task the user named that is not installed is looked for in the current
    directory: then, and only then, that directory is appended to sys.path (last, so
    it never shadows an installed module). Nothing in the current directory is
    importable otherwise; callers import only tasks the user named (a model file's
    metadata never names one: server/serving/loading.py)."""
    top = module_name.split(".", 1)[0]
    cwd = os.getcwd()
    try:
        if cwd in sys.path or importlib.util.find_spec(top) is not None:
            return
        if importlib.machinery.PathFinder.find_spec(top, [cwd]) is not None:
            sys.path.append(cwd)
    except (ImportError, ValueError):
        return  # import_module names the problem


def load_task_function(ref: str) -> Callable[[RunConfig], Task]:
    """Import 'package.module:function'; errors name the reference."""
    module_name, _, func_name = ref.partition(":")
    _find_in_cwd(module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model.task = {ref!r}: cannot import {module_name!r} ({exc})") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"model.task = {ref!r}: {module_name} has no function {func_name!r}")
    return func


def _no_client_data(cid: int) -> ClientData:
    raise RuntimeError(
        f"client {cid}: the coordinator holds no training data (each device brings its own)"
    )


def builtin_server_task(cfg: RunConfig) -> Task:
    """The coordinator's side of a built-in task: model, test set, loss and population size.

    No training set is partitioned: the clients are devices that bring their own data,
    so nothing here knows their sizes (`client_sizes` is None) and `client_data` refuses.
    """
    d = cfg.data
    ds = _builtin_dataset(cfg)
    input_shape, classes, name = tuple(ds.input_shape), ds.num_classes, cfg.model.name
    build_model(name, input_shape, classes)  # fail now, not in round 1
    return Task(  # holds the test set only: the training tensors are freed with `ds`
        name=f"{d.dataset}/{name}",
        input_shape=input_shape,
        num_classes=classes,
        # A naturally split dataset (synthetic) is generated for d.num_clients clients.
        num_clients=ds.num_clients or d.num_clients,
        model_fn=lambda: build_model(name, input_shape, classes),
        client_data=_no_client_data,
        test_data=(ds.x_test, ds.y_test),
    )


def make_server_task(cfg: RunConfig) -> Task:
    """The task a deployed coordinator runs: the user's (it builds what it needs), else the
    built-in one without a simulated population (see `builtin_server_task`)."""
    if cfg.model.task is None:
        return builtin_server_task(cfg)
    return _user_task(cfg, cfg.model.task)


def _user_task(cfg: RunConfig, ref: str) -> Task:
    func = load_task_function(ref)
    check_task_function(ref, func)  # a wrong signature is named, not a raw traceback
    task = func(cfg)
    if not isinstance(task, Task):
        raise ValueError(
            f"model.task = {ref!r}: returned {type(task).__name__}, expected fedveil.tasks.Task"
        )
    return task


def make_task(cfg: RunConfig) -> Task:
    """The task a run trains: the user's when model.task is set, else the built-in one;
    its test set cut to the half eval.split names."""
    task = builtin_task(cfg) if cfg.model.task is None else _user_task(cfg, cfg.model.task)
    return split_test_data(task, cfg.eval.split)


# The permutation that halves a test set: fixed (not the run seed), so the validation half
# a setting was tuned on is disjoint from the test half it is reported on in every run.
_SPLIT_SEED = 0x5E1EC7


def split_test_data(task: Task, split: str) -> Task:
    """`task` with test_data cut to one of two fixed disjoint halves ("validation" or
    "test"); "all" (or no test data) returns it unchanged."""
    if split == "all" or task.test_data is None:
        return task
    if split not in ("validation", "test"):
        raise ValueError(f"eval.split = {split!r}: must be 'all', 'validation' or 'test'")
    x, y = task.test_data
    order = torch.from_numpy(np.random.default_rng(_SPLIT_SEED).permutation(len(y)))
    half = order[: len(y) // 2] if split == "validation" else order[len(y) // 2 :]
    return dataclasses.replace(task, test_data=(x[half], y[half]))
