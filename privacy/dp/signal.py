"""How much of the averaged update is DP noise: stated at submission and at the start of a
simulation, so that a run whose noise wipes out the model is flagged before it spends budget.

The server releases the sum of clipped updates plus noise of std z*C, divided by the
cohort m: the average's noise has std z*C/m per coordinate, against a signal whose whole
norm is at most C. The ratio z/m (noise std per coordinate over C) is stated; above
NOISE_DOMINATES the noise norm (about z*C*sqrt(d)/m over d coordinates) exceeds C for any
model with d >= 100 parameters, so the released average is mostly noise.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedveil.protocol.dp_parameters import DpParameters

from .async_plan import async_dp_config
from .plan import dp_config

NOISE_DOMINATES = 0.1


@dataclass(frozen=True)
class NoiseToSignal:
    """Noise std of the averaged update against the clip norm C."""

    noise_multiplier: float
    clip: float
    expected_cohort: float
    # What lowers the ratio: a bigger cohort (sync) or a bigger buffer K (async).
    remedy: str = "Sample more clients per round (the noise falls as 1/m)"

    @property
    def noise_std(self) -> float:
        """Std of the noise on each coordinate of the averaged update: z*C/m."""
        return self.noise_multiplier * self.clip / max(self.expected_cohort, 1e-12)

    @property
    def ratio(self) -> float:
        """noise_std / C = z / m."""
        return self.noise_std / self.clip

    @property
    def dominates(self) -> bool:
        return self.ratio > NOISE_DOMINATES

    def describe(self) -> str:
        return (
            f"DP noise on the averaged update: std z*C/m = {self.noise_multiplier:.3g}*"
            f"{self.clip:g}/{self.expected_cohort:g} = {self.noise_std:.3g} per coordinate, "
            f"{self.ratio:.3g} x the clip norm C = {self.clip:g}"
        )

    def warning(self) -> str | None:
        """A warning with the numbers when the noise dominates, else None."""
        if not self.dominates:
            return None
        return (
            f"{self.describe()}; above {NOISE_DOMINATES:g} x C the noise outweighs the "
            f"averaged update (whose norm is at most C) for any model of 100+ parameters, "
            f"and training will likely diverge. {self.remedy} or allow a larger dp.epsilon"
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "expected_cohort": self.expected_cohort,
            "noise_std": self.noise_std,
            "ratio": self.ratio,
        }


def noise_to_signal(p: DpParameters, num_clients: int) -> NoiseToSignal | None:
    """The run's expected noise-to-signal (None without DP); z is calibrated if not given."""
    if p.mechanism == "none":
        return None
    if p.asynchronous:
        # Each release is a buffer of K updates, divided by K; the cap-based z (and its
        # refusal when the cap cannot be afforded: ConfigError before any data loads).
        z = async_dp_config(p, num_clients).noise_multiplier
        remedy = "Raise server.buffer (the noise falls as 1/K), lower server.max_participations,"
        return NoiseToSignal(float(z), float(p.clip_norm), float(p.buffer), remedy)
    expected = float(p.per_round) if p.sampling == "fixed" else p.poisson_rate * num_clients
    if p.mechanism == "ftrl":
        # The per-round z that leaves the same noise on the last prefix sum.
        from .ftrl.ftrl_plan import equivalent_noise_multiplier

        remedy = (
            "A larger population lets a larger cohort keep the schema (b <= N x "
            "availability / cohort size): raise server.per_round with data.num_clients"
        )
        z_equivalent = equivalent_noise_multiplier(p)
        return NoiseToSignal(z_equivalent, float(p.clip_norm), expected, remedy)
    z = dp_config(p, num_clients).noise_multiplier
    return NoiseToSignal(float(z), float(p.clip_norm), expected)
