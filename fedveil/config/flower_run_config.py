"""fedveil's run config inside a Flower app's run config ([tool.flwr.app.config]).

Flower flattens the app's config to dotted keys. `fedveil-config` names a TOML file;
fedveil's own keys (`server.rounds`, `secagg.adversarial_rate`, `seed`, ..., optionally
under the `fedveil.` namespace) override it; any other key is the app's own and ignored.
Both sides of a Flower app read their plan through `run_config_of`: fedveil's server and
client apps, and the client mod that wraps a stock strategy's exchange in secure
aggregation (which also asks `names_fedveil_config` whether a plan was given at all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedveil.config.run import RunConfig, load_config
from fedveil.config.run_schema import SECTIONS
from fedveil.config.validator import ConfigError

CONFIG_PATH_KEY = "fedveil-config"  # [tool.flwr.app.config]: the fedveil run config's path
KEY_PREFIX = "fedveil."  # optional namespace of fedveil keys among the app's own
_TOP_KEYS = {f.name for f in dataclasses.fields(RunConfig)} - set(SECTIONS)


def _fedveil_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for key, value in values.items():
        name = key[len(KEY_PREFIX) :] if key.startswith(KEY_PREFIX) else key
        head, dot, _ = name.partition(".")
        if (dot and head in SECTIONS) or (not dot and name in _TOP_KEYS):
            overrides[name] = value
    return overrides


def names_fedveil_config(values: Mapping[str, Any]) -> bool:
    """Whether the app's run config says anything of fedveil's run (a path or a key)."""
    return CONFIG_PATH_KEY in values or bool(_fedveil_keys(values))


def run_config_of(values: Mapping[str, Any]) -> RunConfig:
    """A fedveil RunConfig from a Flower app's run config (see the module doc)."""
    path = values.get(CONFIG_PATH_KEY)
    if path is not None and not isinstance(path, str):
        raise ConfigError(f"{CONFIG_PATH_KEY} = {path!r}: must be a path (a string)")
    return load_config(path, _fedveil_keys(values))
