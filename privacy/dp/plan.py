"""A run's DP plan from its config: the accounting config, and for distributed DP the
noise-share parameters and the survivor threshold that both server and clients hold.

Pure functions of the run config, so a client computes the same plan as the server
and can refuse a server that changes it mid-run (issue: the client holds the
parameters). Only the noise multiplier may need the accountant (when it is
calibrated from epsilon); clients without dp-accounting get it resolved in the
run config they accept.

Asynchronous runs (server.mode = 'async' | 'ssp') have no rounds: each secure-
aggregation group of G = server.group_size clients is one session and one release.
There the cohort a plan is sized for is the group (`max_cohort`, `survivor_floor`),
and z is the one async_plan calibrates to the participation cap, so one plan serves
every group of the run, on the server and on every member alike.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fedveil.config import ConfigError, RunConfig
from fedveil.config.async_dp import is_async
from fedveil.config.async_mode import resolved_group_size
from fedveil.protocol.dp_rules import (
    FIXED,
    POISSON,
    default_neighbouring,
    neighbouring_refusal,
)

from .calibration import calibrate_noise_multiplier
from .config import DpConfig
from .skellam import SkellamParams

MECHANISM_NAMES = {"central": "central_gaussian", "distributed": "distributed_skellam"}


def resolve_neighbouring(cfg: RunConfig) -> str:
    """The adjacency the run is accounted under.

    auto: replace-one for fixed-size cohorts; under Poisson sampling zero-out whenever
    updates travel through secure aggregation (a round's survivor count then decides
    whether it aborts, and under add/remove that count reveals participation; zero-out
    keeps the target in the round with a zero update), add/remove otherwise.
    """
    mechanism = MECHANISM_NAMES.get(cfg.dp.mechanism, cfg.dp.mechanism)
    return _neighbouring(cfg.dp.neighbouring, cfg.server.sampling, cfg.secagg.enabled, mechanism)


def cohorts_are_secret(cfg: RunConfig) -> bool:
    """Amplification by sampling needs cohorts an observer cannot recompute."""
    return not cfg.dp.seeded_cohorts


def max_cohort(cfg: RunConfig, num_clients: int) -> int:
    """Largest cohort a round can have (Poisson: mean + 5 sd, capped by the population);
    asynchronous: a secure-aggregation group of G, the cohort of one session."""
    s = cfg.server
    if is_async(cfg):
        return resolved_group_size(cfg)
    if s.sampling == FIXED:
        return s.per_round
    mean = cfg.poisson_rate * num_clients
    return min(num_clients, math.ceil(mean + 5 * math.sqrt(max(mean, 1.0))))


def dp_config(cfg: RunConfig, num_clients: int) -> DpConfig:
    """The DP layer's config for this run; z is calibrated from the budget when not given.

    With seeded (public) cohorts the events are accounted with q = 1: an observer holding
    the run files knows every cohort, so there is no amplification by sampling.
    """
    key = json.dumps(
        {
            "dp": cfg.dp.__dict__,
            "server": {**cfg.server.__dict__, "sample_rate": cfg.poisson_rate},
            "secagg": cfg.secagg.enabled,
        },
        sort_keys=True,
        default=str,
    )
    return _dp_config(key, num_clients)


@lru_cache(maxsize=16)
def _dp_config(key: str, num_clients: int) -> DpConfig:
    values = json.loads(key)
    dp, s = values["dp"], values["server"]
    poisson = s["sampling"] == POISSON
    rate = float(s["sample_rate"]) if poisson else s["per_round"] / num_clients
    expected = rate * num_clients if poisson else s["per_round"]
    mechanism = MECHANISM_NAMES[dp["mechanism"]]
    neighbouring = _neighbouring(dp["neighbouring"], s["sampling"], values["secagg"], mechanism)
    secret = not dp["seeded_cohorts"]
    # Public cohorts: one unamplified Gaussian per round.
    sampling = s["sampling"] if secret else POISSON
    q = rate if secret else 1.0
    z = float(dp["noise_multiplier"])
    accountant = dp["accountant"]
    if z == 0:
        z = calibrate_noise_multiplier(
            dp["epsilon"],
            dp["delta"],
            s["rounds"],
            q,
            sampling=sampling,
            neighbouring=neighbouring,
            population_size=num_clients,
            accountant=accountant,
            mechanism=mechanism,
        )
    return DpConfig(
        mechanism=mechanism,
        noise_multiplier=z,
        clip_norm=dp["clip"],
        sampling_rate=q,
        rounds=s["rounds"],
        delta=dp["delta"],
        budget_epsilon=dp["epsilon"],
        sampling=sampling,
        neighbouring=neighbouring,
        population_size=num_clients,
        cohort_size=max(1, round(expected)),
        accountant=accountant,
        adaptive_clipping=dp["adaptive_clip"],
        target_quantile=dp["target_quantile"],
        clip_learning_rate=dp["clip_lr"],
        modulus_bits=dp["modulus_bits"],
    )


def _neighbouring(chosen: str, sampling: str, secagg: bool, mechanism: str) -> str:
    """The relation the run is accounted under: `auto` resolved, a refused one refused
    (vocabulary.REFUSED_NEIGHBOURING; the run config's validator refuses it first)."""
    if chosen == "auto":
        return default_neighbouring(mechanism, sampling, secagg)
    refusal = neighbouring_refusal(mechanism, sampling, chosen, secagg)
    if refusal is not None:
        raise ConfigError(f"dp.neighbouring = {chosen!r}: refused ({refusal})")
    return chosen


@dataclass(frozen=True)
class DistributedDpPlan:
    """Run-constant distributed-DP parameters, held by the server and by every client.

    `min_survivors`: fewest masked inputs a round may unmask. Of those, up to `corrupt`
    may belong to clients that `secagg.adversarial_rate` allows to be corrupt (their
    noise shares do not count), so at least `min_honest` honest shares are in every
    unmasked sum; the shares are sized so that `min_honest` of them reach z.
    """

    params: SkellamParams
    min_survivors: int
    min_honest: int
    corrupt: int
    neighbouring: str

    @property
    def noise_multiplier(self) -> float:
        """Gaussian-equivalent z of every unmasked sum (at `min_honest` honest shares)."""
        return self.params.noise_multiplier_for(self.min_honest, self.neighbouring)

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params.to_dict(),
            "min_survivors": self.min_survivors,
            "min_honest": self.min_honest,
            "corrupt": self.corrupt,
            "neighbouring": self.neighbouring,
        }


def survivor_floor(cfg: RunConfig, num_clients: int, threshold: int) -> int:
    """Fewest masked inputs a distributed-DP round may unmask: the Shamir `threshold`, or a
    small cohort (Poisson: mean - 2 sd) less the expected dropouts, capped by the cohort.
    Asynchronous: a group of G less its expected dropouts (G is fixed at dispatch)."""
    fixed = cfg.server.sampling == FIXED or is_async(cfg)
    if is_async(cfg):
        expected: float = resolved_group_size(cfg)
    else:
        expected = cfg.server.per_round if fixed else cfg.poisson_rate * num_clients
    low = expected if fixed else expected - 2 * math.sqrt(expected)
    survivors_low = math.floor(low * (1 - cfg.secagg.dropout_rate))
    return min(max(threshold, 2, survivors_low), max_cohort(cfg, num_clients))


def plan_distributed_dp(cfg: RunConfig, model_size: int, num_clients: int) -> DistributedDpPlan:
    """The noise shares and thresholds of a distributed-DP run (raises ValueError naming the
    setting when no round could ever be released). Asynchronous: the plan of every
    secure-aggregation group, z calibrated to the participation cap; a ConfigError when
    the cap's bound at the plan's fewest honest shares exceeds dp.epsilon."""
    from fedveil.privacy.secagg import ThreatModel, find_parameters

    grouped = is_async(cfg)
    if grouped:
        from .async_plan import async_dp_config

        privacy = async_dp_config(cfg, num_clients)
    else:
        privacy = dp_config(cfg, num_clients)
    s = cfg.secagg
    cohort = max_cohort(cfg, num_clients)
    threat = ThreatModel(s.adversarial_rate, s.dropout_rate, s.threat)
    t = find_parameters(
        cohort, threat, neighbors=s.neighbors or None, threshold=s.threshold or None
    ).threshold
    min_survivors = survivor_floor(cfg, num_clients, t)
    corrupt = math.ceil(s.adversarial_rate * cohort)
    min_honest = min_survivors - corrupt
    if min_honest < 1:
        raise _no_honest_share(s.adversarial_rate, corrupt, cohort, min_survivors, grouped)
    neighbouring = privacy.neighbouring
    params = SkellamParams.calibrate(
        dim=model_size,
        clip_norm=cfg.dp.clip,
        noise_multiplier=privacy.noise_multiplier,
        num_clients=cohort,
        min_clients=min_honest,
        bits=cfg.dp.modulus_bits,
    )
    plan = DistributedDpPlan(params, min_survivors, min_honest, corrupt, neighbouring)
    if grouped:
        from .async_plan import check_group_bound

        check_group_bound(privacy, plan)
    return plan


def _no_honest_share(
    rate: float, corrupt: int, cohort: int, min_survivors: int, grouped: bool
) -> ValueError:
    """The refusal of a plan whose unmasked sums might carry no honest noise share
    (asynchronous groups: a ConfigError naming server.group_size too)."""
    if grouped:
        where, unit, remedy = f"a group of server.group_size = {cohort}", "group", "raise it"
    else:
        where, unit, remedy = f"a cohort of up to {cohort}", "round", "sample larger cohorts"
    error = ConfigError if grouped else ValueError
    return error(
        f"secagg.adversarial_rate = {rate}: up to {corrupt} corrupt clients in {where}, but "
        f"a {unit} may unmask with {min_survivors} survivors, so no honest noise share would "
        f"be guaranteed; lower secagg.adversarial_rate or {remedy}"
    )
