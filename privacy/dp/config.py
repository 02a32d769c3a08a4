"""`DpConfig`: every privacy-relevant choice of a run, explicit and validated."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from fedveil.protocol.dp_rules import (
    ACCOUNTANTS,
    AUTO,
    CENTRAL_GAUSSIAN,
    DISTRIBUTED_SKELLAM,
    DP_FTRL,
    DP_SGD,
    EXAMPLE,
    FIXED,
    MECHANISMS,
    NEIGHBOURING_RELATIONS,
    POISSON,
    PRIVACY_UNITS,
    REPLACE_ONE,
    SAMPLING_SCHEMES,
    USER,
    default_accountant,
    default_neighbouring,
    sound_accountants,
    supported_accountants,
)

from .events import PrivacyEvent

# Andrew et al. 2021 defaults for adaptive clipping.
DEFAULT_INITIAL_CLIP = 0.1
DEFAULT_TARGET_QUANTILE = 0.5
DEFAULT_CLIP_LEARNING_RATE = 0.2
COUNT_STDDEV_DIVISOR = 20  # sigma_b = cohort / 20


@dataclass(frozen=True)
class DpConfig:
    """Mechanism, privacy unit, sampling scheme and neighbouring relation of one run.

    `noise_multiplier` is the TOTAL noise multiplier used for accounting. With
    adaptive clipping part of the privacy goes to the clip-count release, and the
    update noise is `update_noise_multiplier` (slightly larger), per Andrew et al.
    """

    mechanism: str
    noise_multiplier: float
    clip_norm: float
    sampling_rate: float
    rounds: int
    delta: float
    budget_epsilon: float
    privacy_unit: str = USER
    sampling: str = POISSON
    neighbouring: str = AUTO  # resolved on construction (dp_rules.default_neighbouring)
    population_size: int | None = None
    cohort_size: int | None = None  # planned (fixed) or expected (Poisson) cohort
    steps_per_round: int = 1  # DP-SGD: optimizer steps per accounting entry
    accountant: str = AUTO
    adaptive_clipping: bool = False
    target_quantile: float = DEFAULT_TARGET_QUANTILE
    clip_learning_rate: float = DEFAULT_CLIP_LEARNING_RATE
    clip_count_stddev: float | None = None  # default cohort_size / 20
    modulus_bits: int = 20  # distributed DP: secure-aggregation modulus 2**bits
    # Asynchronous training: no sampling (q = 1), each client in at most this many
    # releases; epsilon composes only that many (participation.py). None: every release.
    max_participations: int | None = None

    def __post_init__(self) -> None:
        if self.neighbouring == AUTO and self.mechanism in MECHANISMS:
            # frozen: the resolved relation is what the ledger records and checks.
            resolved = default_neighbouring(self.mechanism, self.sampling)
            object.__setattr__(self, "neighbouring", resolved)
        self._validate_vocabulary()
        self._validate_numbers()
        self._validate_sampling()
        self._validate_adaptive()

    # ------------------------------------------------------------------ derived
    @property
    def accountant_name(self) -> str:
        """The concrete accountant ('auto' resolved to the tightest valid one)."""
        if self.accountant != AUTO:
            return self.accountant
        return default_accountant(self.mechanism, self.sampling, self.neighbouring)

    @property
    def count_stddev(self) -> float:
        """Std of the Gaussian noise on the clip-indicator count (adaptive clipping)."""
        if self.clip_count_stddev is not None:
            return self.clip_count_stddev
        if self.cohort_size is None:
            raise ValueError("count_stddev needs cohort_size or clip_count_stddev")
        return self.cohort_size / COUNT_STDDEV_DIVISOR

    @property
    def update_noise_multiplier(self) -> float:
        """Noise multiplier for the update sum (equals `noise_multiplier` without adaptivity)."""
        if not self.adaptive_clipping:
            return self.noise_multiplier
        from .adaptive_clipping import update_noise_multiplier

        return update_noise_multiplier(self.noise_multiplier, self.count_stddev)

    def round_event(self, noise_multiplier: float | None = None) -> PrivacyEvent:
        """The privacy event of one round (override z, e.g. distributed DP after dropouts)."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return PrivacyEvent(
            noise_multiplier=z,
            sampling_rate=self.sampling_rate,
            steps=self.steps_per_round,
            sampling=self.sampling,
            neighbouring=self.neighbouring,
            population_size=self.population_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DpConfig:
        return cls(**data)

    # --------------------------------------------------------------- validation
    def _validate_vocabulary(self) -> None:
        _check(self.mechanism in MECHANISMS, "mechanism", self.mechanism, MECHANISMS)
        _check(self.privacy_unit in PRIVACY_UNITS, "privacy_unit", self.privacy_unit, PRIVACY_UNITS)
        _check(self.sampling in SAMPLING_SCHEMES, "sampling", self.sampling, SAMPLING_SCHEMES)
        _check(
            self.neighbouring in NEIGHBOURING_RELATIONS,
            "neighbouring",
            self.neighbouring,
            NEIGHBOURING_RELATIONS,
        )
        # DP-SGD clips per example; the federated mechanisms clip per client update.
        expected_unit = EXAMPLE if self.mechanism == DP_SGD else USER
        _check(
            self.privacy_unit == expected_unit,
            "privacy_unit",
            self.privacy_unit,
            f"{expected_unit!r} for mechanism {self.mechanism!r}",
        )
        _check(
            self.accountant in (AUTO, *ACCOUNTANTS),
            "accountant",
            self.accountant,
            (AUTO, *ACCOUNTANTS),
        )
        supported = supported_accountants(self.sampling, self.neighbouring)
        # Opacus and dp-accounting cannot bound fixed-size sampling under add/remove
        # (the population size itself changes); replace-one is the honest relation.
        _check(
            bool(supported),
            "neighbouring",
            self.neighbouring,
            f"{REPLACE_ONE!r} for sampling {FIXED!r}"
            if self.sampling == FIXED
            else NEIGHBOURING_RELATIONS,
        )
        sound = sound_accountants(self.mechanism, self.sampling, self.neighbouring)
        # Distributed DP under add/remove: the target's noise share leaves with it,
        # a change of variance that no shift-based bound covers.
        _check(
            bool(sound),
            "neighbouring",
            self.neighbouring,
            f"{default_neighbouring(self.mechanism, self.sampling)!r} for mechanism "
            f"{self.mechanism!r} with sampling {self.sampling!r}"
            + (f" (or {REPLACE_ONE!r})" if self.sampling != FIXED else ""),
        )
        if self.accountant != AUTO:
            _check(
                self.accountant in sound,
                "accountant",
                self.accountant,
                f"{sound} for mechanism {self.mechanism!r} with sampling={self.sampling!r}, "
                f"neighbouring={self.neighbouring!r}",
            )

    def _validate_numbers(self) -> None:
        _check(
            _positive(self.noise_multiplier),
            "noise_multiplier",
            self.noise_multiplier,
            "a finite number > 0",
        )
        _check(_positive(self.clip_norm), "clip_norm", self.clip_norm, "a finite number > 0")
        _check(
            _is_number(self.sampling_rate) and 0 < self.sampling_rate <= 1,
            "sampling_rate",
            self.sampling_rate,
            "(0, 1]",
        )
        _check(_is_int(self.rounds) and self.rounds >= 1, "rounds", self.rounds, "an integer >= 1")
        _check(_is_number(self.delta) and 0 < self.delta < 1, "delta", self.delta, "(0, 1)")
        _check(
            _positive(self.budget_epsilon),
            "budget_epsilon",
            self.budget_epsilon,
            "a finite number > 0",
        )
        _check(
            _is_int(self.steps_per_round) and self.steps_per_round >= 1,
            "steps_per_round",
            self.steps_per_round,
            "an integer >= 1",
        )
        _check(
            self.mechanism == DP_SGD or self.steps_per_round == 1,
            "steps_per_round",
            self.steps_per_round,
            f"1 for mechanism {self.mechanism!r}",
        )
        _check(
            _is_int(self.modulus_bits) and 8 <= self.modulus_bits <= 22,
            "modulus_bits",
            self.modulus_bits,
            "an integer in [8, 22] (float32 headroom)",
        )
        if self.population_size is not None:
            _check(
                _is_int(self.population_size) and self.population_size >= 1,
                "population_size",
                self.population_size,
                "an integer >= 1",
            )
            # delta must be small against 1/N, or "release one record" is within delta.
            _check(
                self.delta < 1 / self.population_size,
                "delta",
                self.delta,
                f"(0, 1/population_size) = (0, {1 / self.population_size:.3g})",
            )
        if self.cohort_size is not None:
            _check(
                _is_int(self.cohort_size) and self.cohort_size >= 1,
                "cohort_size",
                self.cohort_size,
                "an integer >= 1",
            )
        if self.max_participations is not None:
            _check(
                _is_int(self.max_participations) and self.max_participations >= 1,
                "max_participations",
                self.max_participations,
                "an integer >= 1",
            )
            # A cap replaces amplification: the releases are unsampled.
            _check(
                self.sampling_rate == 1.0,
                "sampling_rate",
                self.sampling_rate,
                "1.0 with max_participations (asynchronous releases are not sampled)",
            )
        if self.mechanism == DISTRIBUTED_SKELLAM and self.cohort_size is not None:
            _check(
                2**self.modulus_bits >= 2 * self.cohort_size,
                "modulus_bits",
                self.modulus_bits,
                f">= log2(2 * cohort_size) = {math.log2(2 * self.cohort_size):.1f}",
            )

    def _validate_sampling(self) -> None:
        if self.sampling != FIXED:
            return
        if self.mechanism == DP_FTRL:
            # Fixed-size cohorts drawn within the participation schema, accounted at
            # rate 1: DP-FTRL claims no amplification by sampling.
            _check(self.sampling_rate == 1.0, "sampling_rate", self.sampling_rate, "1.0 (DP-FTRL)")
            return
        _check(
            self.population_size is not None,
            "population_size",
            self.population_size,
            "an integer >= 1 (required for fixed-size sampling)",
        )
        _check(
            self.cohort_size is not None,
            "cohort_size",
            self.cohort_size,
            "an integer >= 1 (required for fixed-size sampling)",
        )
        assert self.population_size is not None and self.cohort_size is not None
        _check(
            self.cohort_size <= self.population_size,
            "cohort_size",
            self.cohort_size,
            f"[1, population_size={self.population_size}]",
        )
        expected = self.cohort_size / self.population_size
        _check(
            math.isclose(self.sampling_rate, expected, rel_tol=1e-9),
            "sampling_rate",
            self.sampling_rate,
            f"cohort_size / population_size = {expected!r}",
        )

    def _validate_adaptive(self) -> None:
        if not self.adaptive_clipping:
            return
        _check(
            self.mechanism == CENTRAL_GAUSSIAN,
            "adaptive_clipping",
            self.adaptive_clipping,
            f"False unless mechanism is {CENTRAL_GAUSSIAN!r}",
        )
        _check(
            _is_number(self.target_quantile) and 0 < self.target_quantile < 1,
            "target_quantile",
            self.target_quantile,
            "(0, 1)",
        )
        _check(
            _positive(self.clip_learning_rate),
            "clip_learning_rate",
            self.clip_learning_rate,
            "a finite number > 0",
        )
        if self.clip_count_stddev is None:
            _check(
                self.cohort_size is not None,
                "cohort_size",
                self.cohort_size,
                "an integer >= 1 (adaptive clipping sets sigma_b = cohort_size / 20)",
            )
        else:
            _check(
                _positive(self.clip_count_stddev),
                "clip_count_stddev",
                self.clip_count_stddev,
                "a finite number > 0",
            )
        # The count release consumes part of the privacy: z_total < sigma_b is needed
        # for the update noise multiplier to exist (Andrew et al. 2021, Thm 1).
        _check(
            self.noise_multiplier < self.count_stddev,
            "noise_multiplier",
            self.noise_multiplier,
            f"(0, clip_count_stddev={self.count_stddev!r}) with adaptive clipping",
        )


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return _is_number(value) and math.isfinite(value) and value > 0  # type: ignore[arg-type]


def _check(ok: bool, field: str, value: object, allowed: object) -> None:
    if not ok:
        raise ValueError(f"DpConfig.{field}={value!r} is invalid; allowed: {allowed}")
