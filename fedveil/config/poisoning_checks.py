"""`[poisoning]`'s checks: malicious clients in simulation (issue 22), off unless `attack`
is set. The section itself (`PoisoningConfig`) is in run_schema.py.

The attacks themselves live in simulations/poisoning.py: simulation only, never
in a deployment (the coordinator refuses a run that sets them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.config.validator import ConfigError

if TYPE_CHECKING:
    from fedveil.config.run_schema import RunConfig


def check_poisoning(cfg: RunConfig) -> None:
    """Settings an attack cannot run with."""
    p = cfg.poisoning
    if p.attack == "none":
        return
    if cfg.transport != "inprocess":
        # Flower's client app builds its own runtime: giving attackers a policy there
        # would take monkeypatching Flower's client construction.
        raise ConfigError(
            f"poisoning.attack = {p.attack!r} with transport = {cfg.transport!r}: attacks run "
            "only on the in-process engine (transport = 'inprocess')"
        )
    if cfg.client.dp_sgd_noise > 0:
        raise ConfigError(
            f"poisoning.attack = {p.attack!r} with client.dp_sgd_noise > 0: DP-SGD training "
            "does not go through the attack policy; set client.dp_sgd_noise = 0"
        )
