"""Federated evaluation as a differentially private release (drift evaluation of a DP model).

The devices' accuracy on a model is a statistic of their data, so under DP it is released
like a model update: summed under secure aggregation, noised, accounted and ledgered.

Contribution (user-level). Each device sends ONE vector whatever its number of examples:
its held-out accuracy a in [0, 1] and its mean loss clipped to the plan's cap and scaled,
l = min(loss, cap) / cap in [0, 1], both clamped by the device itself; the secure sum also
counts the device once (the encoding's weight, fixed to 1). So one device moves the sum
(count, sum a, sum l) by at most v = (1, a, l), and

    SENSITIVITY = max ||v||_2 = sqrt(3)      (add/remove of one device)

Example-weighted means would have unbounded sensitivity (one device with many examples
moves them arbitrarily) and are never released. Quantization onto the secure-aggregation
grid keeps every coordinate of v within [-1, 1] (the grid's range), so the bound holds for
the rounded values too; it holds for honest devices only (the server cannot see a masked
input to check it, docs/explanation/trust-model.md).

Mechanism: central Gaussian N(0, (z * SENSITIVITY)^2) on each of the three sums, drawn from
the OS CSPRNG (rng.py), z calibrated with the accountant (Opacus' PRV) so that ONE
evaluation costs at most `epsilon` at `delta`. PRV rather than PLD: for one unsampled
Gaussian they agree to a few percent, and PRV takes about a second at any epsilon where
dp-accounting's PLD takes a minute for a small z (a large per-evaluation epsilon). The
devices are the connected ones, not a sample of a known population: no amplification is
claimed (q = 1). The released mean accuracy and loss are post-processing of the noised
sums (the count included, so the number of devices that answered is not released), clamped
to their ranges; so is any decision taken from them (the retrain below a threshold), which
therefore costs nothing more.

Several evaluations of one version compose with the same accountant (`composed_epsilon`):
the budget per watched version caps that figure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fedveil.protocol.dp_rules import ADD_REMOVE, CENTRAL_GAUSSIAN, POISSON, PRV

from .accounting import compute_epsilon
from .calibration import calibrate_noise_multiplier
from .central import add_gaussian_noise
from .config import DpConfig
from .events import PrivacyEvent

SENSITIVITY = math.sqrt(3.0)  # ||(count 1, accuracy, scaled loss)||_2 at most
CONTRIBUTION_SIZE = 2  # what a device encodes: (accuracy, scaled loss); the count is its weight
ACCOUNTANT = PRV  # Opacus' PRV: sound, tight and fast for unsampled Gaussian releases
RELEASE_KIND = "drift_evaluation"  # the ledger's `release` field for these entries


def contribution(accuracy: float, loss: float, loss_cap: float) -> np.ndarray:
    """A device's vector (accuracy, min(loss, cap) / cap), each clamped to [0, 1] here, on
    the device, whatever the request asked: this is what bounds the sensitivity."""
    if not (math.isfinite(loss_cap) and loss_cap > 0):
        raise ValueError(f"loss_cap = {loss_cap!r}: must be a finite number > 0")
    if not (math.isfinite(accuracy) and math.isfinite(loss)):
        raise ValueError(f"accuracy {accuracy!r}, loss {loss!r}: not finite (no examples?)")
    acc = min(max(float(accuracy), 0.0), 1.0)
    scaled = min(max(float(loss), 0.0), loss_cap) / loss_cap
    return np.array([acc, scaled], dtype=np.float32)


@dataclass(frozen=True)
class NoisedEvaluation:
    """What an evaluation publishes: the noised means, clamped to their ranges."""

    accuracy: float
    loss: float


@dataclass(frozen=True)
class EvaluationPlan:
    """One evaluation's mechanism: (epsilon, delta) and the z that meets it, and the cap on
    a device's loss. The server and the ledger hold the same plan."""

    epsilon: float
    delta: float
    noise_multiplier: float
    loss_cap: float

    def __post_init__(self) -> None:
        for name in ("epsilon", "noise_multiplier", "loss_cap"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"evaluation plan: {name} = {value!r}; allowed: a number > 0")
        if not 0 < self.delta < 1:
            raise ValueError(f"evaluation plan: delta = {self.delta!r}; allowed: (0, 1)")

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, loss_cap: float) -> EvaluationPlan:
        """The smallest z (the accountant's, checked) for which one evaluation costs <= epsilon."""
        z = calibrate_noise_multiplier(
            epsilon, delta, 1, 1.0, neighbouring=ADD_REMOVE, accountant=ACCOUNTANT
        )
        return cls(epsilon, delta, z, loss_cap)

    @property
    def noise_std(self) -> float:
        """Std of the Gaussian on each released sum."""
        return self.noise_multiplier * SENSITIVITY

    def event(self) -> PrivacyEvent:
        return evaluation_event(self.noise_multiplier)

    def dp_config(self) -> DpConfig:
        """The ledger's view of one evaluation: a central Gaussian release with
        per-user contributions bounded by SENSITIVITY, budget `epsilon`."""
        return DpConfig(
            mechanism=CENTRAL_GAUSSIAN,
            noise_multiplier=self.noise_multiplier,
            clip_norm=SENSITIVITY,
            sampling_rate=1.0,
            rounds=1,
            delta=self.delta,
            budget_epsilon=self.epsilon,
            sampling=POISSON,
            neighbouring=ADD_REMOVE,
            accountant=ACCOUNTANT,
        )

    def release(
        self,
        count: float,
        accuracy_sum: float,
        loss_sum: float,
        rng: np.random.Generator | None = None,
    ) -> NoisedEvaluation:
        """Noise the three sums once, then derive the means (post-processing). `loss_sum` is
        of the scaled losses in [0, 1]. Pass no `rng` in production (the OS CSPRNG)."""
        noised = add_gaussian_noise(
            np.array([count, accuracy_sum, loss_sum], dtype=np.float64),
            self.noise_multiplier,
            SENSITIVITY,
            rng,
        ).astype(np.float64)
        # A noised count below 1 would blow the ratio up; any divisor >= 1 is post-processing.
        divisor = max(float(noised[0]), 1.0)
        accuracy = min(max(float(noised[1]) / divisor, 0.0), 1.0)
        scaled = min(max(float(noised[2]) / divisor, 0.0), 1.0)
        return NoisedEvaluation(accuracy, scaled * self.loss_cap)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationPlan:
        try:
            return cls(
                float(data["epsilon"]),
                float(data["delta"]),
                float(data["noise_multiplier"]),
                float(data["loss_cap"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"evaluation plan {data!r}: {exc}") from None


def evaluation_event(noise_multiplier: float) -> PrivacyEvent:
    """One evaluation as the accountant composes it: unsampled (q = 1), add/remove."""
    return PrivacyEvent(noise_multiplier, 1.0, 1, POISSON, ADD_REMOVE)


def composed_epsilon(events: Iterable[PrivacyEvent], delta: float) -> float:
    """Epsilon at `delta` of several evaluations (of one version), composed by the
    accountant (0 for none)."""
    return compute_epsilon(list(events), delta, ACCOUNTANT)
