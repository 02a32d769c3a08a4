"""Limits of `server.aggregation = "allreduce"` (docs/how-to/secure-allreduce.md).

Every client of the population is a silo and takes part in every round; the silos sum
among themselves, so nothing a coordinator would do is available: no central DP (the
coordinator adds that noise), no client sampling, no asynchronous mode, no server
optimizer beyond FedAvg's step. Distributed DP is accounted as a fixed cohort of the
whole population (rate 1) under replace-one.
"""

from __future__ import annotations

from typing import Any

from fedveil.config.validator import ConfigError

MAX_SILOS = 64  # one thread (simulation) or one process each; a secure sum is O(N) masks


def check_allreduce_fields(cfg: Any) -> None:
    if cfg.server.aggregation != "allreduce":
        return
    n = cfg.data.num_clients
    where = 'server.aggregation = "allreduce"'
    if not 2 <= n <= MAX_SILOS:
        raise ConfigError(f"{where}: data.num_clients = {n} silos; must be in [2, {MAX_SILOS}]")
    if cfg.dp.mechanism == "central":
        raise ConfigError(
            f"{where}: dp.mechanism = 'central' needs a coordinator to add the noise; "
            "use 'distributed' (each silo adds a Skellam share) or 'none'"
        )
    if cfg.dp.mechanism == "distributed" and cfg.dp.neighbouring not in ("auto", "replace_one"):
        raise ConfigError(
            f"{where}: dp.neighbouring = {cfg.dp.neighbouring!r}; every silo is in every "
            "round (fixed cohort), accounted under 'replace_one'"
        )
    if cfg.server.mode != "sync":
        raise ConfigError(f"{where}: server.mode = {cfg.server.mode!r}; only 'sync'")
    if cfg.server.sampling != "fixed" or cfg.server.per_round != n:
        raise ConfigError(
            f"{where}: every silo takes part in every round; set server.sampling = 'fixed' "
            f"and server.per_round = data.num_clients ({n}), got "
            f"{cfg.server.sampling!r} and {cfg.server.per_round}"
        )
    if cfg.server.optimizer != "fedavg":
        raise ConfigError(
            f"{where}: server.optimizer = {cfg.server.optimizer!r}; the silos apply the "
            "mean with server.server_lr (fedavg)"
        )
    if cfg.transport != "inprocess":
        raise ConfigError(
            f"{where}: transport = {cfg.transport!r}; the silos run in this process "
            "(`fedveil silo` runs them as processes)"
        )
