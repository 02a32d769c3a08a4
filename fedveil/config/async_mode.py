"""Checks of the asynchronous / stale-synchronous settings (server.mode = async | ssp).

Each refusal names the field, its value and what is allowed. Why a value is refused:

- buffer K > concurrency C: K arrivals could never be in flight together, so the first
  server update would wait for clients that were never dispatched.
- max_staleness: 0 means no limit and any m >= 1 keeps every update with tau <= m. The
  first K updates of a run are always fresh (tau = 0: nothing was applied before they
  arrive), so no m >= 0 drops every update; the only such values are negative ones,
  refused by the field's range. A cap that would starve the run is refused instead
  (max_participations below).
- ssp_bound S < 0: refused by the field's range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedveil.config.async_dp import check_async_dp
from fedveil.config.validator import ConfigError

if TYPE_CHECKING:
    from fedveil.config.run_schema import RunConfig


# The fewest members a group may release at: with 2, each learns the other's update.
MIN_RELEASE = 3


def resolved_concurrency(cfg: RunConfig) -> int:
    """C: clients in flight (server.concurrency; 0: server.per_round)."""
    return cfg.server.concurrency or cfg.server.per_round


def resolved_group_size(cfg: RunConfig) -> int:
    """G: clients per dispatch unit (server.group_size; 0: K under secagg, else 1)."""
    return cfg.group_size


def rounds_are_dispatches(cfg: RunConfig | None) -> bool:
    """Whether a client message's round is a dispatch number (async and ssp) rather than
    a sync round. Sessions then cannot be retired by round: a group whose keys were agreed
    ahead sends its masked input after later dispatches went out, and the central
    evaluation's round (the model version) trails them all."""
    return cfg is not None and cfg.server.mode != "sync"


def check_async_fields(cfg: RunConfig) -> None:
    """The async settings against each other and the rest of the run."""
    s = cfg.server
    if s.mode == "sync":
        if s.group_dispatch_at:
            raise ConfigError(
                f"server.group_dispatch_at = {s.group_dispatch_at} with server.mode = 'sync': "
                "a rolling dispatch is an asynchronous group's; set it to 0, or use "
                "server.mode = 'async' | 'ssp'"
            )
        if s.group_start_order != "client_id":
            raise ConfigError(
                f"server.group_start_order = {s.group_start_order!r} with server.mode = "
                "'sync': it orders a rolling asynchronous group's starts; set it to "
                "'client_id', or use server.mode = 'async' | 'ssp'"
            )
        if s.group_member_model != "dispatch":
            raise ConfigError(
                f"server.group_member_model = {s.group_member_model!r} with server.mode = "
                "'sync': it is a rolling asynchronous group's; set it to 'dispatch', or use "
                "server.mode = 'async' | 'ssp'"
            )
        if s.group_unmask != "survivors":
            raise ConfigError(
                f"server.group_unmask = {s.group_unmask!r} with server.mode = 'sync': it "
                "ends an asynchronous group's unmask stage; set it to 'survivors', or use "
                "server.mode = 'async' | 'ssp'"
            )
        if s.group_release_at:
            raise ConfigError(
                f"server.group_release_at = {s.group_release_at} with server.mode = 'sync': "
                "a release at R of G is an asynchronous group's; set it to 0, or use "
                "server.mode = 'async' | 'ssp'"
            )
        return
    n, c, k, g = cfg.data.num_clients, resolved_concurrency(cfg), s.buffer, resolved_group_size(cfg)
    if c > n:
        raise ConfigError(
            f"server.concurrency = {c}: more clients in flight than exist; "
            f"must be <= data.num_clients = {n}"
        )
    if k > c:
        raise ConfigError(
            f"server.buffer = {k}: more than server.concurrency = {c} clients in flight; "
            f"must be in [1, {c}]"
        )
    if g > c:
        raise ConfigError(f"server.group_size = {g}: must be <= server.concurrency = {c}")
    _check_unsupported(cfg)  # what cannot run at all is named first
    if cfg.secagg.enabled and (g < k or g < 3):
        # With 2, each member learns the other's update from the sum; the protocol
        # refuses fewer than 3 at session start, so every group would fail. The threat
        # model's minimum for G is checked with the data (privacy/secagg/feasibility.py).
        raise ConfigError(
            f"server.group_size = {g}: a secure-aggregation group must hold at least "
            f"server.buffer = {k} clients and at least 3"
        )
    check_group_release(cfg)
    if s.group_dispatch_at and not cfg.secagg.enabled:
        raise ConfigError(
            f"server.group_dispatch_at = {s.group_dispatch_at} with secagg.enabled = false: "
            "in the clear each client is its own unit, dispatched as its slot comes free "
            "already; set it to 0"
        )
    if s.group_dispatch_at > g:
        raise ConfigError(
            f"server.group_dispatch_at = {s.group_dispatch_at}: must be in [1, "
            f"server.group_size = {g}] (the free slots a group goes out with), or 0 (G)"
        )
    check_member_model(cfg)
    check_group_unmask(cfg)
    if s.group_start_order != "client_id" and not 0 < s.group_dispatch_at < g:
        raise ConfigError(
            f"server.group_start_order = {s.group_start_order!r}: needs rolling dispatch, "
            f"server.group_dispatch_at in [1, server.group_size - 1 = {g - 1}] (now "
            f"{s.group_dispatch_at}): otherwise every member starts with the group; set it "
            "to 'client_id'"
        )
    cap = s.max_participations
    if cap and cap * n < s.rounds * k:
        raise ConfigError(
            f"server.max_participations = {cap}: {n} clients x {cap} dispatches cannot give "
            f"server.rounds = {s.rounds} updates of server.buffer = {k}; must be >= "
            f"{-(-s.rounds * k // n)} (or 0: no cap)"
        )


def _check_unsupported(cfg: RunConfig) -> None:
    """What async/ssp does not run (yet), refused rather than silently mis-accounted."""
    s, mode = cfg.server, cfg.server.mode
    # Async DP (H2, fedveil/config/async_dp.py): central DP with a participation cap;
    # what cannot be accounted (no cap, distributed DP, ...) is refused there.
    check_async_dp(cfg)
    if cfg.client.dp_sgd_noise > 0:
        raise ConfigError(
            f"client.dp_sgd_noise > 0 with server.mode = {mode!r}: its accountant counts "
            "sync rounds; use server.mode = 'sync'"
        )
    if s.aggregator != "mean":
        raise ConfigError(
            f"server.aggregator = {s.aggregator!r} with server.mode = {mode!r}: async "
            "updates are weighted by staleness; only 'mean' is supported"
        )
    if s.sampling != "fixed":
        raise ConfigError(
            f"server.sampling = {s.sampling!r} with server.mode = {mode!r}: async draws "
            "replacement clients one unit at a time; use 'fixed'"
        )


def check_group_release(cfg: RunConfig) -> None:
    """server.group_release_at R against the group (G), the buffer (K <= R, as K <= G for a
    whole group: the server learns sums of no fewer) and the threat model: a group of G
    releases at its first R masked inputs, the other G - R members left out by design
    and their pairwise masks removed by dropout recovery. The Shamir threshold t <= R is
    checked with the threat model (privacy/secagg/feasibility.py)."""
    r, g, sa = cfg.server.group_release_at, resolved_group_size(cfg), cfg.secagg
    if not r:
        return
    if not sa.enabled:
        raise ConfigError(
            f"server.group_release_at = {r} with secagg.enabled = false: a release at R of G "
            "is a secure-aggregation group's (in the clear each update is its own unit); "
            "set it to 0"
        )
    if not MIN_RELEASE <= r <= g:
        raise ConfigError(
            f"server.group_release_at = {r}: must be in [{MIN_RELEASE}, server.group_size "
            f"= {g}] (the server learns the sum of the first R; with 2, each member learns "
            "the other's update from it)"
        )
    k = cfg.server.buffer
    if r < k:
        raise ConfigError(
            f"server.group_release_at = {r}: below server.buffer = {k}; a released sum must "
            f"cover at least the buffer's K updates, as a whole group of G >= K does"
        )
    # The members left out by design are dropouts of the session: the threat model's
    # parameters (neighbours, threshold) must be derived for at least that many.
    left_out, budget = g - r, sa.dropout_rate * g
    if not (left_out <= budget + 1e-9):
        raise ConfigError(
            f"secagg.dropout_rate = {sa.dropout_rate:g}: a group of server.group_size = {g} "
            f"releasing at server.group_release_at = {r} leaves {left_out} members out by "
            f"design, more than the threat model's {budget:g} dropouts; set "
            f"secagg.dropout_rate >= {left_out / g:.4g} or raise server.group_release_at"
        )


def check_group_unmask(cfg: RunConfig) -> None:
    """server.group_unmask = 'threshold': a group's unmask stage ends at its first t
    replies. Enough only where every reply carries a share of every secret to
    reconstruct (a complete neighbour graph: checked when the scheduler starts, in
    simulation and on devices), and only in the semi-honest protocol: t shares reconstruct a secret
    but cannot correct a wrong one, which the malicious-server session must be able to."""
    s = cfg.server
    if s.group_unmask == "survivors":
        return
    why = ""
    if not cfg.secagg.enabled:
        why = "needs secagg.enabled = true (in the clear there is no unmask stage)"
    elif cfg.secagg.threat != "semi_honest":
        why = (
            f"refused with secagg.threat = {cfg.secagg.threat!r}: t shares reconstruct a "
            "secret but cannot correct a wrong share, which the malicious-server session's "
            "unmask relies on more replies for"
        )
    if why:
        raise ConfigError(f"server.group_unmask = {s.group_unmask!r}: {why}; set it to 'survivors'")


def check_member_model(cfg: RunConfig) -> None:
    """server.group_member_model = 'start': a rolling group's late members train on the
    model current at their own start. It needs what moves a member's start past the
    dispatch (rolling dispatch: S < G, secure aggregation) and the group's whole session
    computed at its arrival, which the simulated clock does only with the keys agreed
    ahead: no DP (a group is counted, and under distributed DP charged, at dispatch) and
    the semi-honest protocol (its stages are the ones timed at dispatch). The simulated
    clock and its latency model are checked when the scheduler starts."""
    s, g = cfg.server, resolved_group_size(cfg)
    mode = s.group_member_model
    if mode == "dispatch":
        return
    why = ""
    if not cfg.secagg.enabled:
        why = "needs secagg.enabled = true (in the clear each client starts with its unit)"
    elif not 0 < s.group_dispatch_at < g:
        why = (
            f"needs rolling dispatch, server.group_dispatch_at in [1, server.group_size - 1 "
            f"= {g - 1}] (now {s.group_dispatch_at}): otherwise every member starts with "
            "the group"
        )
    elif cfg.dp.mechanism != "none":
        why = (
            f"refused with dp.mechanism = {cfg.dp.mechanism!r}: a group's session is "
            "computed at its arrival, while DP counts (and distributed DP charges) it at "
            "dispatch"
        )
    elif cfg.secagg.threat != "semi_honest":
        why = (
            f"refused with secagg.threat = {cfg.secagg.threat!r}: its consistency stage is "
            "not among the stages timed at dispatch; use 'semi_honest'"
        )
    if why:
        raise ConfigError(f"server.group_member_model = {mode!r}: {why}; or set it to 'dispatch'")
