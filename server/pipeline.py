"""A run's privacy pipeline from its config: how updates travel, and what DP does on top.

| secagg | dp          | channel                      | server DP stage            |
| ------ | ----------- | ---------------------------- | -------------------------- |
| off    | none        | PlainChannel                 | -                          |
| off    | central     | PlainChannel (clipped)       | Gaussian noise + ledger    |
| on     | none        | SecAgg, quantized + weights  | -                          |
| on     | central     | SecAgg, quantized (clipped)  | Gaussian noise + ledger    |
| on     | distributed | SecAgg, Skellam noise shares | ledger (noise from clients)|
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from fedveil.config import RunConfig
from fedveil.privacy.dp import SkellamParams
from fedveil.privacy.secagg import ThreatModel, find_parameters
from fedveil.tasks import Task

from .aggregation import PlainChannel, UpdateChannel
from .privacy_stage import CentralDP, DistributedDP
from .secagg_channel import QuantizedEncoding, SecAggChannel, SkellamEncoding


def max_cohort(cfg: RunConfig, num_clients: int) -> int:
    """Largest cohort a round can have (Poisson: mean + 5 sd, capped by the population)."""
    s = cfg.server
    if s.sampling == "fixed":
        return s.per_round
    mean = cfg.poisson_rate * num_clients
    return min(num_clients, math.ceil(mean + 5 * math.sqrt(max(mean, 1.0))))


def make_privacy_pipeline(
    cfg: RunConfig,
    task: Task,
    ledger_path: Path,
    roster: Mapping[int, bytes] | None = None,
) -> tuple[CentralDP | None, UpdateChannel]:
    """The run's DP accounting and update channel. `roster` (client id -> Ed25519
    identity public key) is required for secagg.threat = 'malicious'."""
    mechanism = cfg.dp.mechanism
    if cfg.secagg.enabled and cfg.secagg.threat == "malicious" and roster is None:
        raise ValueError(
            "secagg.threat = 'malicious' needs the clients' identity roster "
            "(deployment: [secagg] roster in server.toml; simulation makes its own)"
        )
    if not cfg.secagg.enabled:
        privacy = CentralDP(cfg, task.num_clients, ledger_path) if mechanism == "central" else None
        return privacy, PlainChannel()
    if mechanism == "distributed":
        privacy = DistributedDP(cfg, task.num_clients, ledger_path)
        cohort = max_cohort(cfg, task.num_clients)
        s = cfg.secagg
        threat = ThreatModel(s.adversarial_rate, s.dropout_rate, s.threat)
        t = find_parameters(
            cohort, threat, neighbors=s.neighbors or None, threshold=s.threshold or None
        ).threshold
        # Noise shares are sized so that even the fewest survivors a round may
        # decode add up to z: a small cohort (Poisson: mean - 2 sd) less the
        # expected dropouts. Fewer survivors abort the round; nothing is released.
        expected = privacy.expected_cohort
        low = expected if cfg.server.sampling == "fixed" else expected - 2 * math.sqrt(expected)
        min_clients = max(t, 2, math.floor(low * (1 - s.dropout_rate)))
        model_size = sum(p.numel() for p in task.model_fn().parameters())
        params = SkellamParams.calibrate(
            dim=model_size,
            clip_norm=cfg.dp.clip,
            noise_multiplier=privacy.config.noise_multiplier,
            num_clients=cohort,
            min_clients=min(min_clients, cohort),
            bits=cfg.dp.modulus_bits,
        )
        privacy.bind(params)
        return privacy, SecAggChannel(cfg.secagg, SkellamEncoding(params), roster)
    privacy = CentralDP(cfg, task.num_clients, ledger_path) if mechanism == "central" else None
    max_weight = 1 if privacy is not None else cfg.secagg.max_weight or _largest_client(task)
    return privacy, SecAggChannel(
        cfg.secagg,
        QuantizedEncoding(cfg.secagg.clip_range, cfg.secagg.levels, max_weight),
        roster,
    )


def _largest_client(task: Task) -> int:
    if task.client_sizes is not None and len(task.client_sizes):
        return int(max(task.client_sizes))
    return 10_000
