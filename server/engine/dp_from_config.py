"""The run config -> privacy layer adapter: the DP plan of a RunConfig.

The privacy layer takes plain parameters (fedveil.protocol.dp_parameters), never the
application's RunConfig; these functions take a RunConfig, as the engine, the
coordinator, the CLI and the simulations hold one, and hand the privacy layer
`cfg.dp_parameters()`. Same names and results as the privacy functions they wrap;
where a plan may be asynchronous, the run config's own refusals (check_async_dp, each
explaining itself in full) run first, and the privacy layer's terser checks of the same
invariants after.
A client builds the same parameters with `cfg.dp_parameters()` (the client may not
import the engine).
"""

from __future__ import annotations

from fedveil.config import RunConfig
from fedveil.config.async_dp import check_async_dp
from fedveil.privacy.dp import async_plan, plan, signal
from fedveil.privacy.dp.config import DpConfig
from fedveil.privacy.dp.distributed_plan import DistributedDpPlan
from fedveil.privacy.secagg import cohort_bounds, feasibility


def dp_config(cfg: RunConfig, num_clients: int) -> DpConfig:
    """The DP layer's config of a synchronous run (plan.dp_config)."""
    return plan.dp_config(cfg.dp_parameters(), num_clients)


def async_dp_config(cfg: RunConfig, num_clients: int) -> DpConfig:
    """The DP layer's config of an asynchronous run (async_plan.async_dp_config), after the
    run config's own refusals (check_async_dp: each names the field and explains why)."""
    check_async_dp(cfg)
    return async_plan.async_dp_config(cfg.dp_parameters(), num_clients)


def plan_distributed_dp(cfg: RunConfig, model_size: int, num_clients: int) -> DistributedDpPlan:
    """The distributed-DP plan the server and every client hold (plan.plan_distributed_dp)."""
    check_async_dp(cfg)
    return plan.plan_distributed_dp(cfg.dp_parameters(), model_size, num_clients)


def max_cohort(cfg: RunConfig, num_clients: int) -> int:
    """The largest cohort (or asynchronous group) a round can have (cohort_bounds.max_cohort)."""
    return cohort_bounds.max_cohort(cfg.dp_parameters(), num_clients)


def cohorts_are_secret(cfg: RunConfig) -> bool:
    """Whether sampling amplifies: cohorts no observer can recompute."""
    return plan.cohorts_are_secret(cfg.dp_parameters())


def resolve_neighbouring(cfg: RunConfig) -> str:
    """The adjacency the run is accounted under (plan.resolve_neighbouring)."""
    return plan.resolve_neighbouring(cfg.dp_parameters())


def noise_to_signal(cfg: RunConfig, num_clients: int) -> signal.NoiseToSignal | None:
    """The run's expected noise-to-signal (signal.noise_to_signal)."""
    check_async_dp(cfg)
    return signal.noise_to_signal(cfg.dp_parameters(), num_clients)


def check_secagg_feasible(cfg: RunConfig, num_clients: int, wait_for_clients: int = 0) -> None:
    """Refuse a run whose rounds cannot reach secure aggregation's threshold
    (feasibility.check_secagg_feasible)."""
    feasibility.check_secagg_feasible(cfg.dp_parameters(), num_clients, wait_for_clients)


def smallest_feasible_group(cfg: RunConfig, num_clients: int) -> int | None:
    """The fewest clients a secure-aggregation group admits (feasibility)."""
    return feasibility.smallest_feasible_group(cfg.dp_parameters(), num_clients)
