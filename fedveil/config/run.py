"""Run configuration: TOML file plus command-line overrides, validated up front.

Every field carries its own limits, so a bad value fails before any data is
loaded or any model trained, with a message naming the field, the value and
the allowed range.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

from fedveil.config.allreduce_checks import check_allreduce_fields
from fedveil.config.async_mode import check_async_fields
from fedveil.config.gossip_checks import check_gossip
from fedveil.config.poisoning_checks import check_poisoning
from fedveil.config.ray_address import check_ray_address
from fedveil.config.robust_bounds import check_robust_config
from fedveil.config.run_schema import (
    SECTIONS,
    RunConfig,
    TrackingConfig,
)
from fedveil.config.validator import ConfigError, build, help_of
from fedveil.protocol.dp_rules import (
    AUTO,
    DP_FTRL,
    MECHANISM_OF_CONFIG,
    POISSON,
    ZERO_OUT,
    default_neighbouring,
)
from fedveil.protocol.dp_rules import refusal as dp_refusal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# Tracking URIs MLflow itself resolves; a plain path is a local file store.
MLFLOW_SCHEMES = ("file", "http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks")


def _check_cross_fields(cfg: RunConfig) -> None:
    """Limits that depend on more than one field."""
    n = cfg.data.num_clients
    gossip = cfg.server.aggregation == "gossip"  # every client trains: no cohort
    if cfg.server.sampling == "fixed" and cfg.server.per_round > n and not gossip:
        raise ConfigError(
            f"server.per_round = {cfg.server.per_round}: more sampled clients than exist; "
            f"must be <= data.num_clients = {n}"
        )
    if cfg.server.min_clients > n:
        raise ConfigError(f"server.min_clients = {cfg.server.min_clients}: must be <= {n}")
    if cfg.client.local_epochs == 0 and cfg.client.local_steps == 0:
        raise ConfigError("client.local_epochs = 0 and client.local_steps = 0: set one of them")
    if cfg.client.dp_sgd_noise > 0 and (cfg.client.prox_mu > 0 or cfg.client.local_steps > 0):
        raise ConfigError(
            "client.dp_sgd_noise > 0: DP-SGD trains whole Poisson-sampled epochs; "
            "it cannot be combined with client.prox_mu or client.local_steps"
        )
    if cfg.eval.federated_every > 0 and cfg.eval.client_holdout == 0:
        raise ConfigError(
            "eval.federated_every > 0 needs eval.client_holdout > 0 "
            "(the share of each client's data kept for local evaluation)"
        )
    _check_dp_fields(cfg)
    check_async_fields(cfg)
    check_allreduce_fields(cfg)
    _check_simulation_fields(cfg)
    check_robust_config(cfg)
    check_poisoning(cfg)
    check_gossip(cfg)
    _check_tracking(cfg.tracking)
    task = cfg.model.task
    if task is None:
        from fedveil.builtin_models import MODELS

        if cfg.model.name not in MODELS:
            known = ", ".join(sorted(MODELS))
            raise ConfigError(
                f"model.name = {cfg.model.name!r}: unknown; choose one of {known} "
                "or give a task as 'module:function'"
            )
    if task is not None and (task.count(":") != 1 or not all(task.split(":"))):
        raise ConfigError(f"model.task = {task!r}: must look like 'package.module:function'")


def _check_dp_fields(cfg: RunConfig) -> None:
    """DP settings against each other, the sampling and secure aggregation."""
    dp = cfg.dp
    if dp.mechanism != "none" and dp.epsilon == 0:
        raise ConfigError(
            f"dp.mechanism = {dp.mechanism!r} needs a budget: set dp.epsilon > 0 (e.g. --epsilon 8)"
        )
    _check_dp_rules(cfg)
    # Under allreduce every sum is masked (the silos' secure all-reduce): no secagg switch.
    masked = cfg.secagg.enabled or cfg.server.aggregation == "allreduce"
    if dp.mechanism == "distributed" and not masked:
        raise ConfigError(
            "dp.mechanism = 'distributed' needs secure aggregation (secagg.enabled = true, "
            "--secagg): the noise shares only protect a sum the server cannot see"
        )
    if dp.budget_against == "coordinator" and dp.mechanism != "distributed":
        raise ConfigError(
            f"dp.budget_against = 'coordinator' with dp.mechanism = {dp.mechanism!r}: under "
            "central DP the coordinator is a trusted curator and no epsilon holds against it; "
            "use dp.mechanism = 'distributed' (or budget_against = 'observers')"
        )
    if dp.mechanism == "distributed" and dp.adaptive_clipping:
        raise ConfigError("dp.adaptive_clipping is not supported with dp.mechanism = 'distributed'")
    _check_distributed_evaluation(cfg)
    _check_ftrl_fields(cfg)


def _check_ftrl_fields(cfg: RunConfig) -> None:
    """DP-FTRL: its schema fields only with it; no adaptive clipping or asynchronous rounds
    on top (correlated noise is added once, by the server, at each release index). Its
    sampling, neighbouring and accountant are the rule table's (fedveil.protocol.dp_rules)."""
    dp = cfg.dp
    ftrl_set = dp.ftrl_min_separation != 0 or dp.ftrl_max_participations != 1
    if dp.mechanism != "ftrl":
        if ftrl_set:
            raise ConfigError(
                f"dp.ftrl_min_separation = {dp.ftrl_min_separation}, "
                f"dp.ftrl_max_participations = {dp.ftrl_max_participations} with "
                f"dp.mechanism = {dp.mechanism!r}: the participation schema belongs to "
                "dp.mechanism = 'ftrl'"
                + (
                    "; distributed DP does not combine with correlated noise (each round's "
                    "noise shares are independent)"
                    if dp.mechanism == "distributed"
                    else ""
                )
            )
        return
    if dp.ftrl_max_participations > 1 and dp.ftrl_min_separation == 0:
        raise ConfigError(
            f"dp.ftrl_max_participations = {dp.ftrl_max_participations} needs "
            "dp.ftrl_min_separation >= 1 (0 means single participation)"
        )
    if dp.ftrl_min_separation > cfg.server.rounds:
        raise ConfigError(
            f"dp.ftrl_min_separation = {dp.ftrl_min_separation}: must be <= server.rounds = "
            f"{cfg.server.rounds} (use 0 for single participation)"
        )
    if dp.adaptive_clipping:
        raise ConfigError("dp.adaptive_clipping is not supported with dp.mechanism = 'ftrl'")
    if cfg.server.mode != "sync":
        raise ConfigError(
            f"server.mode = {cfg.server.mode!r} with dp.mechanism = 'ftrl': DP-FTRL runs "
            "synchronous rounds (its noise follows the release index); use server.mode = 'sync'"
        )


def _check_distributed_evaluation(cfg: RunConfig) -> None:
    # Federated evaluation asks each sampled client for its own accuracy and loss in the
    # clear: an un-noised release to the coordinator that distributed DP's epsilon against
    # the coordinator does not account for.
    every = cfg.eval.federated_every
    if cfg.dp.mechanism == "distributed" and every > 0:
        raise ConfigError(
            f"eval.federated_every = {every} with dp.mechanism = 'distributed': refused. "
            "Federated evaluation has each sampled client send the coordinator its own "
            "held-out accuracy, loss and example count in the clear, an un-noised release "
            "of its data that the epsilon stated against the coordinator does not cover. "
            "Set eval.federated_every = 0 (the server's test-set evaluation, "
            "eval.central_every, stays), or use dp.mechanism = 'central', where the "
            "coordinator is the trusted curator"
        )


def _check_simulation_fields(cfg: RunConfig) -> None:
    """Simulation and placement settings: dropout stages, the Ray cluster, the device."""
    if cfg.simulation.dropout_stages:
        try:
            parse_stage_dropout(cfg.simulation.dropout_stages)
        except ValueError as exc:
            raise ConfigError(f"simulation.dropout_stages: {exc}") from None
    try:
        absent = parse_client_ids(cfg.simulation.absent_clients)
    except ValueError as exc:
        raise ConfigError(f"simulation.absent_clients: {exc}") from None
    if absent and not max(absent) < cfg.data.num_clients:
        raise ConfigError(
            f"simulation.absent_clients: client {max(absent)} is not among data.num_clients = "
            f"{cfg.data.num_clients} (ids 0..{cfg.data.num_clients - 1})"
        )
    try:
        check_ray_address(cfg.simulation.ray_address)
    except ValueError as exc:
        raise ConfigError(f"simulation.ray_address = {exc}") from None
    if cfg.transport == "flower" and cfg.device == "cuda" and cfg.simulation.client_gpus == 0:
        # Ray gives a client no GPU unless it reserves one; it would train on CPU silently.
        raise ConfigError(
            "device = 'cuda' with transport = 'flower' needs simulation.client_gpus > 0 "
            "(the GPU share Ray reserves per client; 0 means clients train on CPU)"
        )


def _check_tracking(t: TrackingConfig) -> None:
    uri = t.mlflow_uri
    scheme, sep, _ = uri.partition(":")
    # 'C:\runs' is a Windows path, not a scheme; 'x://' with an unknown scheme is a typo.
    if sep and len(scheme) > 1 and scheme.isalpha() and scheme.lower() not in MLFLOW_SCHEMES:
        raise ConfigError(
            f"tracking.mlflow_uri = {uri!r}: unknown scheme {scheme!r}; use a directory, "
            f"or one of {', '.join(s + ':' for s in MLFLOW_SCHEMES)}"
        )
    if uri and not t.mlflow_experiment.strip():
        raise ConfigError(
            f"tracking.mlflow_experiment = {t.mlflow_experiment!r}: must name an experiment "
            "when tracking.mlflow_uri is set"
        )


def _check_dp_rules(cfg: RunConfig) -> None:
    """dp.mechanism, dp.accountant, server.sampling and dp.neighbouring against the one DP
    rule table (fedveil.protocol.dp_rules), at the sampling the run is configured with and,
    where it differs, the one its releases are accounted at."""
    dp = cfg.dp
    if dp.mechanism == "none":
        return
    mechanism = MECHANISM_OF_CONFIG[dp.mechanism]
    secagg = cfg.secagg.enabled
    shown = {
        "mechanism": repr(dp.mechanism),
        "accountant": repr(dp.accountant),
        "sampling": repr(cfg.server.sampling),
        "neighbouring": repr(dp.neighbouring),
        "secure_aggregation": "true" if secagg else "false",
    }
    row = dp_refusal(mechanism, dp.accountant, cfg.server.sampling, dp.neighbouring, secagg)
    if row is not None:
        raise ConfigError(row.message(shown))
    accounted = _accounted_setting(cfg, mechanism)
    if accounted is None:
        return
    sampling, neighbouring, why = accounted
    row = dp_refusal(mechanism, dp.accountant, sampling, neighbouring, secagg)
    if row is not None:
        shown["sampling"] = f"{cfg.server.sampling!r} ({why}: accounted as {sampling!r})"
        shown["neighbouring"] = repr(neighbouring)
        raise ConfigError(row.message(shown))


def _accounted_setting(cfg: RunConfig, mechanism: str) -> tuple[str, str, str] | None:
    """(sampling, neighbouring, why) the releases are accounted at when that is not the
    configured sampling: unsampled (q = 1, as Poisson) for seeded cohorts, which anyone
    holding the run files can recompute, and for asynchronous runs; None otherwise."""
    dp, sampling = cfg.dp, cfg.server.sampling
    if mechanism == DP_FTRL:  # no amplification to lose: accounted as configured
        return None
    if cfg.server.mode != "sync":
        if dp.neighbouring == "add_remove":
            return None  # fedveil.config.async_dp refuses it, naming server.mode
        neighbouring = ZERO_OUT if dp.neighbouring == AUTO else dp.neighbouring
        return POISSON, neighbouring, f"server.mode = {cfg.server.mode!r}"
    if not dp.seeded_cohorts or sampling == POISSON:
        return None
    neighbouring = dp.neighbouring
    if neighbouring == AUTO:
        neighbouring = default_neighbouring(mechanism, sampling, cfg.secagg.enabled)
    return POISSON, neighbouring, "dp.seeded_cohorts = true"


def parse_stage_dropout(text: str) -> dict[str, float]:
    """'train=0.1,evaluate=0' -> {'train': 0.1, 'evaluate': 0.0}; ValueError naming the item."""
    out: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        stage, sep, value = item.partition("=")
        stage = stage.strip()
        if not sep or not stage:
            raise ValueError(f"{item!r}: expected STAGE=PROBABILITY, e.g. 'train=0.1'")
        try:
            p = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: {value.strip()!r} is not a number") from None
        if not 0.0 <= p <= 0.99:
            raise ValueError(f"{item!r}: probability must be in [0, 0.99]")
        out[stage] = p
    return out


def parse_client_ids(text: str) -> frozenset[int]:
    """'3, 57' -> {3, 57}; ValueError naming the item that is not a client id (>= 0)."""
    out: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            cid = int(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a client id") from None
        if cid < 0:
            raise ValueError(f"{item!r}: a client id is >= 0")
        out.add(cid)
    return frozenset(out)


class DeprecatedKeyWarning(FutureWarning):
    """A run-config key under its earlier name: it still works; the warning names the new."""


# Run-config keys renamed to the names the ledger records -> their new names. The old
# spelling is read, with a DeprecatedKeyWarning, until fedveil 1.0 (docs/explanation/
# dp-rules.md, "Names").
RENAMED_KEYS: dict[str, str] = {
    "dp.clip": "dp.clip_norm",
    "dp.clip_lr": "dp.clip_learning_rate",
    "dp.adaptive_clip": "dp.adaptive_clipping",
}


def renamed_keys(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each RENAMED_KEYS key under its new name (a warning naming both);
    ConfigError when a table gives both names different values."""
    out = dict(values)
    for old, new in RENAMED_KEYS.items():
        section, old_key = old.split(".")
        new_key = new.split(".")[1]
        table = out.get(section)
        if not isinstance(table, dict) or old_key not in table:
            continue
        table = dict(table)
        value = table.pop(old_key)
        if new_key in table and table[new_key] != value:
            raise ConfigError(
                f"{old} = {value!r} and {new} = {table[new_key]!r}: {old} is the earlier name "
                f"of {new}; give only {new}"
            )
        warnings.warn(
            f"{old} is deprecated: use {new} (the name the privacy ledger records); {old} "
            "is read until fedveil 1.0",
            DeprecatedKeyWarning,
            stacklevel=3,
        )
        table[new_key] = value
        out[section] = table
    return out


def config_from_dict(values: dict[str, Any]) -> RunConfig:
    cfg = build(RunConfig, renamed_keys(values), sections=SECTIONS)
    _check_cross_fields(cfg)
    return cfg


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items -> {dotted key: value as text} (load_config types them)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. client.lr=0.1")
        out[key.strip()] = value.strip()
    return out


def set_dotted(values: dict[str, Any], key: str, value: Any) -> None:
    """Set 'section.key' in a nested dict (command-line overrides)."""
    parts = key.split(".")
    node = values
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {part} is not a table")
    node[parts[-1]] = value


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """Read a TOML file (optional), apply dotted-key overrides, validate everything."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            values = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"--config {p}: no such file") from None
        except ValueError as exc:  # TOML errors, non-UTF-8 bytes, an int of 4,300+ digits
            raise ConfigError(f"--config {p}: not valid TOML ({exc})") from None
    for key, value in (overrides or {}).items():
        set_dotted(values, key, value)
    return config_from_dict(values)


def field_help() -> dict[str, str]:
    """'section.key' -> help text, for documentation and --help."""
    return help_of(RunConfig, SECTIONS)


def to_toml(cfg: RunConfig) -> str:
    """The resolved config as TOML (None values are left out, as TOML has no null)."""
    return toml_text(cfg.to_dict())


def toml_text(data: dict[str, Any]) -> str:
    """A config's values (top-level keys, then one table per section) as TOML."""
    lines: list[str] = []
    for key, value in data.items():
        if not isinstance(value, dict) and value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"\n[{key}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items() if v is not None)
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
