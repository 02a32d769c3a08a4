"""fedveil as Flower apps: what a Flower user imports.

    from fedveil.flower import client_app, server_app
    server = server_app("fedveil.toml")   # a fedveil run over Flower's Grid
    client = client_app("fedveil.toml")   # fedveil's ClientApp

Under `flwr run`, name the module-level apps instead (`serverapp = "fedveil.flower:server"`,
`clientapp = "fedveil.flower:client"`): they build the run from the app's
`[tool.flwr.app.config]`, either a path (`fedveil-config = "fedveil.toml"`) or fedveil's
keys themselves, flattened (`server.rounds = 3`, `data.num_clients = 10`, optionally
prefixed `fedveil.`); keys of the app's own are ignored.

The server takes stock Flower ClientApps (`@app.train()`, as in Flower's quickstart) as
well as fedveil's: it speaks to them as `flwr.serverapp.strategy.FedAvg` does (see
fedveil.server.engine.flower_stock_codec). Runs that need fedveil's protocol (secure
aggregation, distributed DP, DP-SGD) refuse them, and legacy NumPyClient apps are refused,
each with a message saying why.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.logger import log as flwr_log
from flwr.server import Grid
from flwr.serverapp import ServerApp

from fedveil.client.flower_client_app import make_client_app
from fedveil.client.flower_secagg_mod import fedveil_secagg_mod
from fedveil.client.runtime import ClientRuntime
from fedveil.config import ConfigError, RunConfig, config_from_dict, load_config, to_toml
from fedveil.config.flower_run_config import run_config_of
from fedveil.protocol.flower_codec import KINDS, STOCK_EVALUATE, STOCK_TRAIN, message_type
from fedveil.server.engine.flower_secagg import (
    BudgetExhausted,
    FlowerDP,
    SecAggGrid,
    SecureAggregationRefused,
    secure,
)
from fedveil.server.engine.flower_secagg_strategies import StrategyRefused
from fedveil.server.engine.flower_server_app import FlowerTransport
from fedveil.server.engine.flower_stock_codec import StockCodec, protocol_needs
from fedveil.server.engine.lifecycle import RunLifecycle
from fedveil.server.engine.rounds import RoundRecord, initial_model
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.tracking import publishable_metrics
from fedveil.tasks import Task, make_server_task, make_task

__all__ = [
    "BudgetExhausted",
    "FlowerDP",
    "RunFailed",
    "SecAggGrid",
    "SecureAggregationRefused",
    "StrategyRefused",
    "client",
    "client_app",
    "fedveil_secagg_mod",
    "run_config_of",
    "run_server",
    "secure",
    "server",
    "server_app",
]

ConfigSource = RunConfig | str | os.PathLike[str]


class RunFailed(RuntimeError):
    """No client's update was aggregated in any round; the message gives the first cause."""


def _resolve(config: ConfigSource) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    return load_config(Path(config))


def resolve_device(name: str) -> torch.device:
    """'auto': CUDA when there is one, else the CPU; 'cuda' without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device = 'cuda': no CUDA device is available here; use 'auto' or 'cpu'")
    return torch.device(name)


def _refuse_without_roster(cfg: RunConfig) -> None:
    if cfg.secagg.enabled and cfg.secagg.threat == "malicious":
        raise ConfigError(
            "secagg.threat = 'malicious' needs the clients' identity roster, which a plain "
            "Flower app has no way to hold: run it with `fedveil simulate` or a fedveil "
            "server deployment, or use secagg.threat = 'semi_honest'"
        )


# -- the server -------------------------------------------------------------------------
def server_app(config: ConfigSource | None = None) -> ServerApp:
    """A Flower ServerApp running the fedveil run `config` (a RunConfig or a TOML path;
    None: the app's run config under `flwr run`, as the module-level `server`)."""
    cfg = None if config is None else _resolve(config)
    if cfg is not None:
        _refuse_without_roster(cfg)
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        run_server(grid, cfg if cfg is not None else run_config_of(context.run_config))

    return app


def run_server(grid: Grid, cfg: RunConfig) -> dict[str, Any]:
    """One whole run over `grid` into the run directory `cfg.out`; returns the summary.
    The server holds the task's model and test set, never client data."""
    _refuse_without_roster(cfg)
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    task = make_server_task(cfg)
    cfg = _with_population(cfg, task)
    if cfg.transport != "flower":  # the run's record names the transport that ran it
        cfg = config_from_dict(_without_none({**cfg.to_dict(), "transport": "flower"}))
    store = RunStore(cfg.out)
    store.clear()
    store.write_config(to_toml(cfg))
    lifecycle = RunLifecycle(cfg, task, store, device=device)
    transport = FlowerTransport(
        grid,
        expected_clients=task.num_clients,
        stock=StockCodec(initial_model(task, cfg.seed)),
        protocol_needs=protocol_needs(cfg),
    )
    engine = lifecycle.engine(
        transport, resume=False, on_round=_RoundLog(cfg.server.rounds, cfg.dp.mechanism != "none")
    )
    summary = engine.run()
    summary.update(device=str(device), out=str(Path(cfg.out)))
    summary["wall_s"] = round(time.perf_counter() - start, 3)
    lifecycle.finish(engine, summary, model_metadata={"task": task.name})
    if cfg.dp.mechanism == "none" and summary.get("rounds_applied") == 0:
        raise RunFailed(
            f"no client's update was aggregated in {summary['rounds']} rounds; first client "
            f"error: {summary.get('first_client_error')}"
        )
    return summary


class _RoundLog:
    """Each round's public figures in Flower's log, which `flwr run --stream` and
    `flwr log` show: under DP only what metrics.jsonl publishes (epsilon, the server's
    own evaluation), as for every other tracker."""

    def __init__(self, rounds: int, dp: bool) -> None:
        self.rounds, self.dp = rounds, dp

    def __call__(self, record: RoundRecord) -> None:
        values = publishable_metrics(record, dp=self.dp)
        shown = [
            f"{key} {values[key]:.4g}"
            for key in ("test_accuracy", "test_loss", "train_loss", "epsilon", "cohort_aggregated")
            if key in values
        ]
        status = record.public_json().get("status", "")
        flwr_log(
            logging.INFO,
            "[fedveil] round %d/%d %s%s",
            record.round,
            self.rounds,
            f"{status}: " if status else "",
            ", ".join(shown),
        )


def _with_population(cfg: RunConfig, task: Task) -> RunConfig:
    """The config with data.num_clients = the task's population (a custom task has its own)."""
    if task.num_clients == cfg.data.num_clients:
        return cfg
    values = cfg.to_dict()
    values["data"]["num_clients"] = task.num_clients
    return config_from_dict(_without_none(values))


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, dict) else v
        for k, v in values.items()
        if v is not None
    }


# -- the client -------------------------------------------------------------------------
class _RuntimeFactory:
    """Picklable: builds the task and client runtime in the process that runs the client."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def __call__(self) -> ClientRuntime:
        device = resolve_device(self.cfg.device)
        return ClientRuntime(make_task(self.cfg), device, None, run_config=self.cfg)


def client_app(config: ConfigSource | None = None) -> ClientApp:
    """fedveil's Flower ClientApp for the run `config` (a RunConfig or a TOML path; None:
    the app's run config under `flwr run`, as the module-level `client`). Its client id is
    the node's `partition-id` (simulation) or `client-id` (node config)."""
    if config is None:
        return client
    cfg = _resolve(config)
    _refuse_without_roster(cfg)
    return make_client_app(_RuntimeFactory(cfg))


# The run config's ClientApp in this process, by the run config it was built from.
_CLIENT_APPS: dict[str, ClientApp] = {}


def _client_of(context: Context) -> ClientApp:
    key = repr(sorted(context.run_config.items()))
    app = _CLIENT_APPS.get(key)
    if app is None:
        _CLIENT_APPS.clear()  # one run at a time per process
        app = _CLIENT_APPS[key] = client_app(run_config_of(context.run_config))
    return app


def _lazy_client() -> ClientApp:
    """A ClientApp that builds fedveil's from the app's run config at its first message."""
    app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        return _client_of(context)(msg, context)

    for mtype in {*(message_type(kind) for kind in KINDS), STOCK_TRAIN, STOCK_EVALUATE}:
        category, _, action = mtype.partition(".")
        register = getattr(app, category)
        (register(action) if action else register())(handle)
    return app


def _lazy_server() -> ServerApp:
    return server_app(None)


# `flwr run`: serverapp = "fedveil.flower:server", clientapp = "fedveil.flower:client".
server: ServerApp = _lazy_server()
client: ClientApp = _lazy_client()
