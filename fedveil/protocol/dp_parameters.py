"""`DpParameters`: the plain values a run's DP plan is computed from.

The privacy layer (privacy/dp/plan.py, async_plan.py, signal.py,
privacy/secagg/feasibility.py) takes these, not the application's RunConfig, so that
it stays a library: the server's engine and every client build them from their run
config (`RunConfig.dp_parameters()`), and both compute the same plan from the same
values. Plain data, no validation here: the run config validated the values, and the
plan checks the mechanism's own invariants again (it also serves ledger verification).
"""

from __future__ import annotations

from dataclasses import dataclass

SYNC = "sync"


@dataclass(frozen=True)
class DpParameters:
    """The [dp], cohort and secure-aggregation settings a DP plan reads (run-config
    names in the comments)."""

    # [dp]
    mechanism: str  # dp.mechanism: 'none' | 'central' | 'distributed' | 'ftrl'
    clip_norm: float  # dp.clip_norm
    noise_multiplier: float  # dp.noise_multiplier; 0: calibrate from epsilon
    epsilon: float  # dp.epsilon (the budget)
    delta: float  # dp.delta
    neighbouring: str  # dp.neighbouring ('auto' unresolved)
    accountant: str  # dp.accountant ('auto' unresolved)
    adaptive_clipping: bool  # dp.adaptive_clipping
    target_quantile: float  # dp.target_quantile
    clip_learning_rate: float  # dp.clip_learning_rate
    modulus_bits: int  # dp.modulus_bits
    seeded_cohorts: bool  # dp.seeded_cohorts
    ftrl_factorization: str  # dp.ftrl_factorization: 'tree' | 'banded' | 'blt'
    ftrl_min_separation: int  # dp.ftrl_min_separation (0: single participation)
    ftrl_max_participations: int  # dp.ftrl_max_participations
    # [server]: how cohorts are drawn
    rounds: int  # server.rounds
    sampling: str  # server.sampling: 'fixed' | 'poisson'
    per_round: int  # server.per_round
    sample_rate: float  # server.sample_rate as given (0: per_round / num_clients)
    poisson_rate: float  # the Poisson rate q in use
    mode: str  # server.mode: 'sync' | 'async' | 'ssp'
    group_size: int  # G, clients per asynchronous dispatch unit (resolved)
    group_release_at: int  # server.group_release_at R: a group releases at R (0: all G)
    buffer: int  # server.buffer K
    max_participations: int  # server.max_participations (0: no cap)
    # [secagg]
    secure_aggregation: bool  # secagg.enabled
    adversarial_rate: float  # secagg.adversarial_rate
    dropout_rate: float  # secagg.dropout_rate
    threat: str  # secagg.threat
    neighbors: int  # secagg.neighbors (0: derived)
    threshold: int  # secagg.threshold (0: derived)

    @property
    def asynchronous(self) -> bool:
        """True for the modes without sampled cohorts ('async', 'ssp')."""
        return self.mode != SYNC
