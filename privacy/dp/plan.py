"""A run's DP plan from its config: the accounting config, and for distributed DP the
noise-share parameters and the survivor threshold that both server and clients hold.

Pure functions of the run's plain DP parameters (fedveil.protocol.dp_parameters:
`RunConfig.dp_parameters()` on either side), so a client computes the same plan as the
server and can refuse a server that changes it mid-run (issue: the client holds the
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

import math
from functools import lru_cache

from fedveil.config.validator import ConfigError
from fedveil.privacy.secagg.cohort_bounds import max_cohort, survivor_floor
from fedveil.protocol.dp_parameters import DpParameters
from fedveil.protocol.dp_rules import (
    MECHANISM_OF_CONFIG,
    POISSON,
    default_neighbouring,
    neighbouring_refusal,
)

from .async_plan import async_dp_config, check_group_bound
from .calibration import calibrate_noise_multiplier
from .config import DpConfig
from .distributed_plan import DistributedDpPlan
from .skellam import SkellamParams

# dp.mechanism -> the ledger's mechanism (kept under its earlier name for callers).
MECHANISM_NAMES = MECHANISM_OF_CONFIG

__all__ = [
    "DistributedDpPlan",
    "cohorts_are_secret",
    "dp_config",
    "max_cohort",
    "plan_distributed_dp",
    "resolve_neighbouring",
    "survivor_floor",
]


def resolve_neighbouring(p: DpParameters) -> str:
    """The adjacency the run is accounted under.

    auto: replace-one for fixed-size cohorts; under Poisson sampling zero-out whenever
    updates travel through secure aggregation (a round's survivor count then decides
    whether it aborts, and under add/remove that count reveals participation; zero-out
    keeps the target in the round with a zero update), add/remove otherwise.
    """
    mechanism = MECHANISM_OF_CONFIG.get(p.mechanism, p.mechanism)
    return _neighbouring(p.neighbouring, p.sampling, p.secure_aggregation, mechanism)


def cohorts_are_secret(p: DpParameters) -> bool:
    """Amplification by sampling needs cohorts an observer cannot recompute."""
    return not p.seeded_cohorts


@lru_cache(maxsize=16)
def dp_config(p: DpParameters, num_clients: int) -> DpConfig:
    """The DP layer's config for this run; z is calibrated from the budget when not given.

    With seeded (public) cohorts the events are accounted with q = 1: an observer holding
    the run files knows every cohort, so there is no amplification by sampling.
    """
    poisson = p.sampling == POISSON
    rate = float(p.poisson_rate) if poisson else p.per_round / num_clients
    expected = rate * num_clients if poisson else p.per_round
    mechanism = MECHANISM_OF_CONFIG[p.mechanism]
    neighbouring = _neighbouring(p.neighbouring, p.sampling, p.secure_aggregation, mechanism)
    secret = cohorts_are_secret(p)
    # Public cohorts: one unamplified Gaussian per round.
    sampling = p.sampling if secret else POISSON
    q = rate if secret else 1.0
    z = float(p.noise_multiplier)
    if z == 0:
        z = calibrate_noise_multiplier(
            p.epsilon,
            p.delta,
            p.rounds,
            q,
            sampling=sampling,
            neighbouring=neighbouring,
            population_size=num_clients,
            accountant=p.accountant,
            mechanism=mechanism,
        )
    return DpConfig(
        mechanism=mechanism,
        noise_multiplier=z,
        clip_norm=p.clip_norm,
        sampling_rate=q,
        rounds=p.rounds,
        delta=p.delta,
        budget_epsilon=p.epsilon,
        sampling=sampling,
        neighbouring=neighbouring,
        population_size=num_clients,
        cohort_size=max(1, round(expected)),
        accountant=p.accountant,
        adaptive_clipping=p.adaptive_clipping,
        target_quantile=p.target_quantile,
        clip_learning_rate=p.clip_learning_rate,
        modulus_bits=p.modulus_bits,
    )


def _neighbouring(chosen: str, sampling: str, secagg: bool, mechanism: str) -> str:
    """The relation the run is accounted under: `auto` resolved, a refused one refused
    (the rule table's REFUSALS; the run config's validator refuses it first)."""
    if chosen == "auto":
        return default_neighbouring(mechanism, sampling, secagg)
    refusal = neighbouring_refusal(mechanism, sampling, chosen, secagg)
    if refusal is not None:
        raise ConfigError(f"dp.neighbouring = {chosen!r}: refused ({refusal})")
    return chosen


def plan_distributed_dp(p: DpParameters, model_size: int, num_clients: int) -> DistributedDpPlan:
    """The noise shares and thresholds of a distributed-DP run (raises ValueError naming the
    setting when no round could ever be released). Asynchronous: the plan of every
    secure-aggregation group, z calibrated to the participation cap; a ConfigError when
    the cap's bound at the plan's fewest honest shares exceeds dp.epsilon."""
    from fedveil.privacy.secagg import ThreatModel, find_parameters

    grouped = p.asynchronous
    privacy = async_dp_config(p, num_clients) if grouped else dp_config(p, num_clients)
    cohort = max_cohort(p, num_clients)
    threat = ThreatModel(p.adversarial_rate, p.dropout_rate, p.threat)
    t = find_parameters(
        cohort, threat, neighbors=p.neighbors or None, threshold=p.threshold or None
    ).threshold
    min_survivors = survivor_floor(p, num_clients, t)
    corrupt = math.ceil(p.adversarial_rate * cohort)
    min_honest = min_survivors - corrupt
    if min_honest < 1:
        raise _no_honest_share(p.adversarial_rate, corrupt, cohort, min_survivors, grouped)
    neighbouring = privacy.neighbouring
    params = SkellamParams.calibrate(
        dim=model_size,
        clip_norm=p.clip_norm,
        noise_multiplier=privacy.noise_multiplier,
        num_clients=cohort,
        min_clients=min_honest,
        bits=p.modulus_bits,
    )
    plan = DistributedDpPlan(params, min_survivors, min_honest, corrupt, neighbouring)
    if grouped:
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
