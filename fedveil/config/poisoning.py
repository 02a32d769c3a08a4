"""`[poisoning]`: malicious clients in simulation (issue 22), off unless `attack` is set.

The attacks themselves live in simulations/poisoning.py: simulation only, never
in a deployment (the coordinator refuses a run that sets them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedveil.config.fields import ConfigError, spec

if TYPE_CHECKING:
    from fedveil.config.run import RunConfig

ATTACKS = ("none", "label_flip", "sign_flip", "gaussian", "scaled", "backdoor")


@dataclass
class PoisoningConfig:
    """Which clients attack and how (simulation only; refused by the coordinator)."""

    attack: str = spec(
        "none",
        choices=ATTACKS,
        help="attack of the malicious clients: label_flip, sign_flip (update x -scale), "
        "gaussian (update replaced by N(0, std^2) noise), scaled (model replacement: backdoor "
        "data, update x scale), backdoor (pixel-pattern trigger relabelled to target_class, "
        "update x boost); 'none': no attackers",
    )
    fraction: float = spec(
        0.1,
        lo=0.0,
        hi=1.0,
        help="share of the population that attacks (a seeded choice, recorded in "
        "poisoning.json); 0 with an attack set: a clean run that still measures "
        "backdoor accuracy",
    )
    scale: float = spec(
        10.0, lo=0.0, lo_open=True, hi=1e6, help="sign_flip and scaled: the update's factor"
    )
    std: float = spec(1.0, lo=0.0, lo_open=True, hi=1e6, help="gaussian: noise std per coordinate")
    boost: float = spec(1.0, lo=0.0, lo_open=True, hi=1e6, help="backdoor: the update's factor")
    target_class: int = spec(0, lo=0, hi=1_000_000, help="backdoor and scaled: the target label")
    trigger_size: int = spec(
        3, lo=1, hi=64, help="the trigger: a square of this many pixels a side (bottom right)"
    )
    poison_share: float = spec(
        0.5,
        lo=0.0,
        lo_open=True,
        hi=1.0,
        help="backdoor and scaled: share of an attacker's examples given the trigger",
    )


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
