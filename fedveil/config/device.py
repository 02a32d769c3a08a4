"""The device-facing part of a run config: what a coordinator sends to the devices.

A device needs the run's task identity (seed, data, model), its local training
and evaluation settings, and what it computes its distributed-DP plan from
(dp, secagg, the sampling part of [server], data.num_clients); see
`privacy.dp.plan`. It never gets the server's paths (`out`, `data.data_dir`),
where the server trains (`device`, `transport`), the in-process engine's
[simulation] settings, the server's optimizer and deadlines, or the run's
[deploy] table (which is no RunConfig field: the coordinator keeps it apart).
"""

from __future__ import annotations

from typing import Any

from fedveil.config.run import toml_text
from fedveil.config.run_schema import RunConfig

# section -> the keys a device receives (None: the whole section but SERVER_ONLY's keys).
DEVICE_FIELDS: dict[str, tuple[str, ...] | None] = {
    "data": None,
    "model": None,
    "client": None,
    "server": ("rounds", "sampling", "per_round", "sample_rate"),
    "eval": ("client_holdout",),
    "secagg": None,
    "dp": None,
}
SERVER_ONLY = {"data": ("data_dir",)}  # a path on the server
DEVICE_TOP_LEVEL = ("seed",)


def device_config(cfg: RunConfig) -> dict[str, Any]:
    """The values of `cfg` a device receives (None values left out: TOML has no null).

    `config_from_dict` rebuilds a RunConfig from them, valid and with every left-out
    field at its default; `privacy.dp.plan.plan_distributed_dp` gives the same plan
    for it as for `cfg`.
    """
    full = cfg.to_dict()
    out: dict[str, Any] = {k: full[k] for k in DEVICE_TOP_LEVEL if full[k] is not None}
    for section, keys in DEVICE_FIELDS.items():
        values = full[section]
        if keys is None:
            keys = tuple(k for k in values if k not in SERVER_ONLY.get(section, ()))
        chosen = {k: values[k] for k in keys}
        out[section] = {k: v for k, v in chosen.items() if v is not None}
    return out


def device_toml(cfg: RunConfig) -> str:
    """`device_config(cfg)` as TOML, as the coordinator hands it to Flower's run config."""
    return toml_text(device_config(cfg))
