"""The plan the client mod around a stock Flower strategy holds (client/flower_secagg_mod.py).

The mod reads its plan where fedveil's own Flower client reads its run config: the app's
run config ([tool.flwr.app.config]: `fedveil-config` naming a TOML file, or fedveil's
own keys such as `secagg.adversarial_rate`), through `run_config_of`. From it, through
client/secagg_floors.py (the functions fedveil's client runtime uses):

- the session floor: a threshold below the floor of the plan's threat model, a degree no
  threshold makes secure, or a semi-honest session in a `secagg.threat = 'malicious'`
  plan is refused at the advertise stage, before any key is made;
- the survivor floor: the plan's cohort (`server.per_round` of `data.num_clients`) less
  its expected dropouts; fewer survivors get no unmasking share.

Without a plan (an app's run config with no fedveil key, as a stock Flower app's is) the
session floor is that of fedveil's default threat model (semi-honest, adversarial rate
0.05, dropout rate 0.1: the one `fedveil.flower.secure` sizes its sessions for by
default, so its default sessions pass and a server set weaker is refused), and the
survivor floor is the session's own threshold t: without a plan the client knows no
cohort size, and any fixed floor could refuse an honest small run.

A plan is required, and refused by name when it is not one this path can keep, where
defaults would silently weaken it: a `fedveil-config` that cannot be loaded (the mod never
falls back to the defaults), and a plan with `dp.mechanism = 'distributed'` or `'ftrl'`
(this path sends a quantized update with no noise share and clocks no ledger: the plan's
epsilon against the coordinator would not hold).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedveil.client.secagg_floors import cohort_survivor_floor, session_floor_of
from fedveil.config import ConfigError
from fedveil.config.flower_run_config import names_fedveil_config, run_config_of
from fedveil.privacy.secagg.session_floor import SessionFloor
from fedveil.protocol.envelope import MessageError

# Mechanisms whose guarantee this path cannot keep (it has no noise share, no ledger clock).
UNSUPPORTED_DP = ("distributed", "ftrl")


@dataclass(frozen=True)
class ModPlan:
    """The mod's floors: the session floor, and the fewest survivors it unmasks for."""

    floor: SessionFloor
    min_survivors: int
    given: bool  # False: fedveil's default threat model (no plan in the app's run config)


_PLANS: dict[str, ModPlan] = {}


def mod_plan(run_config: Mapping[str, Any]) -> ModPlan:
    """The plan in the app's run config (see the module doc); a MessageError naming what
    is wrong with it."""
    key = repr(sorted(run_config.items()))
    plan = _PLANS.get(key)
    if plan is None:
        _PLANS.clear()  # one run at a time per process
        plan = _PLANS[key] = _plan(run_config)
    return plan


def _plan(run_config: Mapping[str, Any]) -> ModPlan:
    try:
        cfg = run_config_of(run_config)
    except (ConfigError, ValueError, OSError) as exc:
        raise MessageError(
            f"this client's plan (the app's run config) cannot be loaded: {exc}; the "
            "client does not fall back to fedveil's defaults"
        ) from None
    mechanism = cfg.dp.mechanism
    if mechanism in UNSUPPORTED_DP:
        raise MessageError(
            f"this client's plan says dp.mechanism = {mechanism!r}; fedveil_secagg_mod sends "
            "a stock strategy's update quantized, with no noise share and no ledger clock, "
            "so that plan's epsilon against the coordinator would not hold: run fedveil's "
            "own client (fedveil.flower.client_app) for it"
        )
    given = names_fedveil_config(run_config)
    population = cfg.data.num_clients
    return ModPlan(
        session_floor_of(cfg, population),
        cohort_survivor_floor(cfg, population) if given else 0,
        given,
    )
