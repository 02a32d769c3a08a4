"""A run's privacy pipeline from its config: how updates travel, and what DP does on top.

| secagg | dp          | channel                      | release mechanism          |
| ------ | ----------- | ---------------------------- | -------------------------- |
| off    | none        | PlainChannel                 | -                          |
| off    | central     | PlainChannel (clipped)       | Gaussian noise + ledger    |
| on     | none        | SecAgg, quantized + weights  | -                          |
| on     | central     | SecAgg, quantized (clipped)  | Gaussian noise + ledger    |
| on     | distributed | SecAgg, Skellam noise shares | ledger (noise from clients)|
| either | ftrl        | as central                   | correlated noise + ledger  |

server.mode = async | ssp swaps the mechanism for its asynchronous one: central DP
(central_release.AsyncCentralDP, noise at each apply) or distributed DP
(distributed_release.AsyncDistributedDP, one release per secure-aggregation group,
charged at its unmask), both capped per client (release_mechanism.ParticipationCapped).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedveil.config import RunConfig
from fedveil.config.async_dp import check_async_dp, is_async
from fedveil.privacy.encodings import QuantizedEncoding, SkellamEncoding
from fedveil.privacy.secagg import SIMULATION_RUN_ID
from fedveil.server.engine.aggregation import PlainChannel, UpdateChannel
from fedveil.server.engine.central_release import AsyncCentralDP, CentralDP, dispatch_counts
from fedveil.server.engine.distributed_release import AsyncDistributedDP, DistributedDP
from fedveil.server.engine.dp_from_config import (
    check_secagg_feasible,
    max_cohort,
    plan_distributed_dp,
)
from fedveil.server.engine.ftrl_stage import FtrlDP, noise_state_path
from fedveil.server.engine.release_mechanism import ReleaseMechanism
from fedveil.server.engine.robust import robust_aggregator
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.sampling import committed_graph_seed
from fedveil.server.engine.secagg_channel import SecAggChannel
from fedveil.tasks import Task

__all__ = ["make_privacy_pipeline", "max_cohort", "private_run_args"]


def private_run_args(
    cfg: RunConfig,
    store: RunStore,
    *,
    run_id: str | None = None,
    signing_key: Path | None = None,
) -> dict[str, Any]:
    """What a DP stage needs from the run directory: the run id its ledger is bound to,
    the key that signs it (`signing_key`; None: the user's key store), the operator's
    private annex, and (on resume) how often each client took part in a charged round
    (the coordinator's epsilon per client)."""
    if cfg.dp.mechanism == "none":
        return {}
    from fedveil.privacy.dp.signing import load_or_create_signer

    participations: dict[int, int] = {}
    if is_async(cfg):  # async DP: the durable per-client dispatch counts (the cap's)
        return {
            "run_id": run_id or store.run_identity()["run_id"],
            "signer": load_or_create_signer(signing_key),
            "private": store.append_private,
            "dispatches": dispatch_counts(store.read_private()),
            # Groups and graph seeds follow it (buffered_scheduler.py); the same key on resume.
            "cohort_key": bytes.fromhex(store.run_identity()["cohort_key"]),
        }
    for line in store.read_private():
        if line.get("kind") == "charge":
            for cid in line.get("survivors", []):
                participations[int(cid)] = participations.get(int(cid), 0) + 1
    return {
        "run_id": run_id or store.run_identity()["run_id"],
        "signer": load_or_create_signer(signing_key),
        "private": store.append_private,
        "participations": participations,
        "cohort_key": bytes.fromhex(store.run_identity()["cohort_key"]),
    }


def make_privacy_pipeline(
    cfg: RunConfig,
    task: Task,
    ledger_path: Path,
    roster: Mapping[int, bytes] | None = None,
    *,
    secagg_run_id: bytes = SIMULATION_RUN_ID,
    **privacy_args: Any,
) -> tuple[ReleaseMechanism | None, UpdateChannel]:
    """The run's DP accounting and update channel. `roster` (client id -> Ed25519
    identity public key) is required for secagg.threat = 'malicious'. `secagg_run_id`
    is the run every secure-aggregation session names (deployment: Flower's run id,
    which devices take from their own context). `privacy_args` go to the release
    mechanism (private_run_args: run_id, signer, private sink, and the participations
    of sync rounds or the dispatches of asynchronous training)."""
    mechanism = cfg.dp.mechanism
    if cfg.secagg.enabled and cfg.secagg.threat == "malicious" and roster is None:
        raise ValueError(
            "secagg.threat = 'malicious' needs the clients' identity roster "
            "(deployment: [secagg] roster in server.toml; simulation makes its own)"
        )
    # A run whose rounds cannot reach the protocol's threshold is refused, not run as
    # rounds that all abort (ConfigError naming the field).
    check_secagg_feasible(cfg, task.num_clients)
    if mechanism == "ftrl":
        return _ftrl_pipeline(cfg, task, ledger_path, roster, secagg_run_id, privacy_args)
    if not cfg.secagg.enabled:
        privacy = (
            _central_dp(cfg, task.num_clients, ledger_path, privacy_args)
            if mechanism == "central"
            else None
        )
        return privacy, plain_channel(cfg, task)
    if mechanism == "distributed":
        # Async: one plan for every group, its bound over the cap refused (ConfigError).
        check_async_dp(cfg)
        privacy = _distributed_dp(cfg, task.num_clients, ledger_path, privacy_args)
        model_size = sum(p.numel() for p in task.model_fn().parameters())
        plan = plan_distributed_dp(cfg, model_size, task.num_clients)
        privacy.bind(plan)
        channel = SecAggChannel(
            cfg.secagg,
            SkellamEncoding(plan.params),
            roster,
            secagg_run_id,
            gate=privacy,
            quiet_counts=True,
            graph_seeds=_committed_graph_seeds(privacy),
            release_at=cfg.server.group_release_at,
            unmask_at_threshold=cfg.server.group_unmask == "threshold",
        )
        return privacy, channel
    privacy = (
        _central_dp(cfg, task.num_clients, ledger_path, privacy_args)
        if mechanism == "central"
        else None
    )
    max_weight = 1 if privacy is not None else cfg.secagg.max_weight or _largest_client(task)
    return privacy, SecAggChannel(
        cfg.secagg,
        QuantizedEncoding(cfg.secagg.clip_range, cfg.secagg.levels, max_weight),
        roster,
        secagg_run_id,
        quiet_counts=privacy is not None,
        graph_seeds=_committed_graph_seeds(privacy),
        release_at=cfg.server.group_release_at,
        unmask_at_threshold=cfg.server.group_unmask == "threshold",
    )


def plain_channel(cfg: RunConfig, task: Task) -> PlainChannel:
    """Updates in the clear, by the run's robust rule; under async or ssp training each
    dispatch's sum is summed again with the buffer's K - 1 others."""
    buffered = cfg.server.buffer if is_async(cfg) else 1
    return PlainChannel(aggregator=robust_aggregator(cfg, task), summed_with=buffered)


def _ftrl_pipeline(
    cfg: RunConfig,
    task: Task,
    ledger_path: Path,
    roster: Mapping[int, bytes] | None,
    secagg_run_id: bytes,
    privacy_args: Mapping[str, Any],
) -> tuple[CentralDP, UpdateChannel]:
    """DP-FTRL: clipped updates in the clear or summed under secure aggregation (weight
    1, as central DP), the correlated noise added by the server (ftrl_stage.py)."""
    model_size = sum(p.numel() for p in task.model_fn().parameters())
    privacy = FtrlDP(
        cfg,
        task.num_clients,
        ledger_path,
        model_size=model_size,
        noise_state=noise_state_path(ledger_path),
        **privacy_args,
    )
    if not cfg.secagg.enabled:
        return privacy, plain_channel(cfg, task)
    return privacy, SecAggChannel(
        cfg.secagg,
        QuantizedEncoding(cfg.secagg.clip_range, cfg.secagg.levels, 1),
        roster,
        secagg_run_id,
        quiet_counts=True,
    )


def _central_dp(
    cfg: RunConfig, num_clients: int, ledger_path: Path, privacy_args: Mapping[str, Any]
) -> CentralDP | AsyncCentralDP:
    """Central DP's stage: sampled rounds (sync), or unsampled releases capped per client
    (server.mode = async | ssp; refused with a ConfigError when not accountable)."""
    if is_async(cfg):
        return AsyncCentralDP(cfg, num_clients, ledger_path, **privacy_args)
    return CentralDP(cfg, num_clients, ledger_path, **privacy_args)


def _distributed_dp(
    cfg: RunConfig, num_clients: int, ledger_path: Path, privacy_args: Mapping[str, Any]
) -> DistributedDP | AsyncDistributedDP:
    """Distributed DP's stage: per sampled round (sync), or per secure-aggregation group
    with a per-client cap (server.mode = async | ssp)."""
    if is_async(cfg):
        return AsyncDistributedDP(cfg, num_clients, ledger_path, **privacy_args)
    return DistributedDP(cfg, num_clients, ledger_path, **privacy_args)


def _committed_graph_seeds(
    privacy: ReleaseMechanism | None,
) -> Callable[[int], bytes] | None:
    if privacy is None or not privacy.cohorts_secret:
        return None
    return functools.partial(committed_graph_seed, privacy.cohort_key)


def _largest_client(task: Task) -> int:
    if task.client_sizes is not None and len(task.client_sizes):
        return int(max(task.client_sizes))
    return 10_000
