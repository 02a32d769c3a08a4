"""Can a run's rounds ever reach secure aggregation's threshold? Checked before any data is
loaded (simulate) or any device is asked (submission), so that a run which could only abort
every round is refused instead of reported as "completed" with nothing aggregated.

Secure aggregation needs at least 3 clients per round (with 2, each learns the other's
update from the sum). An asynchronous group that releases at its first R members
(server.group_release_at) needs R >= the Shamir threshold t of its G. Under distributed
DP a round also needs the plan's `min_survivors` masked inputs before it may unmask
(privacy/dp/plan.py).
"""

from __future__ import annotations

import math

from fedveil.config.validator import ConfigError
from fedveil.protocol.dp_parameters import DpParameters

from .cohort_bounds import max_cohort, survivor_floor
from .params import ThreatModel, find_parameters

MIN_CLIENTS = 3


def _cohort(p: DpParameters, num_clients: int) -> tuple[str, str, float]:
    """(the config key that sets the cohort, its value, the expected cohort size).
    Asynchronous training runs one protocol session per group of G clients: G is the
    cohort whose threshold the threat model must admit."""
    if p.asynchronous:
        return "server.group_size", str(p.group_size), float(p.group_size)
    if p.sampling == "fixed":
        return "server.per_round", str(p.per_round), float(p.per_round)
    expected = p.poisson_rate * num_clients
    if p.sample_rate > 0:
        return "server.sample_rate", f"{p.sample_rate:g}", expected
    return "server.per_round", str(p.per_round), expected


def check_secagg_feasible(p: DpParameters, num_clients: int, wait_for_clients: int = 0) -> None:
    """Raise ConfigError, naming the field, when secure aggregation's rounds cannot reach
    the protocol's threshold: the cohort (fixed, or the expected Poisson cohort) is below
    3 clients or below the distributed-DP survivor floor, the threat model admits no
    threshold for it, or `wait_for_clients` (deployment; 0: not set) starts the run with
    fewer clients than a round needs."""
    if not p.secure_aggregation:
        return
    key, value, expected = _cohort(p, num_clients)
    how = "a cohort of" if p.sampling == "fixed" else "an expected Poisson cohort of"
    if expected < MIN_CLIENTS:
        raise ConfigError(
            f"{key} = {value}: secure aggregation needs at least {MIN_CLIENTS} clients per "
            f"round, and this run has {how} {expected:g} (data.num_clients = {num_clients}); "
            "every round would abort with nothing aggregated. Sample at least "
            f"{MIN_CLIENTS} clients per round, or set secagg.enabled = false"
        )
    n = max(MIN_CLIENTS, math.floor(expected))
    try:
        threat = ThreatModel(p.adversarial_rate, p.dropout_rate, p.threat)
        params = find_parameters(
            n, threat, neighbors=p.neighbors or None, threshold=p.threshold or None
        )
    except ValueError as exc:
        field = key
        if p.threshold and "threshold=" in str(exc):
            field = "secagg.threshold"
        elif p.neighbors and "neighbors" in str(exc):
            field = "secagg.neighbors"
        shown = {"secagg.threshold": p.threshold, "secagg.neighbors": p.neighbors}.get(field, value)
        if field == "server.group_size":  # every group's session would fail to start
            smallest = smallest_feasible_group(p, num_clients)
            least = f"at least {smallest}" if smallest else f"none up to {num_clients}"
            raise ConfigError(
                f"server.group_size = {value}: a secure-aggregation group of {n} admits no "
                f"threshold under secagg.threat = {p.threat!r} (adversarial_rate "
                f"{p.adversarial_rate:g}, dropout_rate {p.dropout_rate:g}): {exc}. "
                f"server.group_size must be {least}"
            ) from None
        raise ConfigError(f"{field} = {shown}: for {how} {n}: {exc}") from None
    release = p.group_release_at if p.asynchronous else 0
    if release and release < params.threshold:  # every group would abort at unmask
        raise ConfigError(
            f"server.group_release_at = {release}: below the Shamir threshold t = "
            f"{params.threshold} of a group of {key} = {value} (secagg.threat = "
            f"{p.threat!r}); a group released at {release} could never unmask. Must be >= "
            f"{params.threshold}"
        )
    need, why = MIN_CLIENTS, f"secure aggregation needs at least {MIN_CLIENTS} clients"
    if p.mechanism == "distributed":
        top = max_cohort(p, num_clients)
        t_top = find_parameters(
            top, threat, neighbors=p.neighbors or None, threshold=p.threshold or None
        ).threshold
        need = survivor_floor(p, num_clients, t_top)
        why = f"distributed DP unmasks a round only with at least {need} surviving clients"
        if expected < need:
            raise ConfigError(
                f"{key} = {value}: {why} (Shamir threshold {t_top}), and this run has {how} "
                f"{expected:g}; every round would abort. Sample larger cohorts"
            )
    if 0 < wait_for_clients < need:
        raise ConfigError(
            f"deploy.wait_for_clients = {wait_for_clients}: {why}, so a run that starts "
            f"with {wait_for_clients} connected could abort every round; wait for at least "
            f"{need}"
        )


def smallest_feasible_group(p: DpParameters, num_clients: int) -> int | None:
    """The fewest clients (>= 3, <= num_clients) for which the threat model admits a
    threshold with the configured overrides; None when no group size does."""
    threat = ThreatModel(p.adversarial_rate, p.dropout_rate, p.threat)
    for g in range(MIN_CLIENTS, num_clients + 1):
        try:
            find_parameters(g, threat, neighbors=p.neighbors or None, threshold=p.threshold or None)
        except ValueError:
            continue
        return g
    return None
