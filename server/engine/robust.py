"""Byzantine-robust aggregation in the clear (`server.aggregator`).

The mean lets one client move the model anywhere. These rules replace it by a
statistic that f attackers among n updates cannot drag arbitrarily far, as long as n
is large enough for f (each rule's bound, `min_cohort`):

| aggregator     | rule                                             | tolerates f when       |
| -------------- | ------------------------------------------------ | ---------------------- |
| `median`       | coordinate-wise median (Yin et al. 2018)         | n >= 2f + 1 (f < n/2)  |
| `trimmed_mean` | drop k largest and k smallest per coordinate     | k >= f, n >= 2k + 1    |
| `krum`         | the update closest to its n - f - 2 neighbours   | n >= 2f + 3            |
| `multi_krum`   | the mean of the m best Krum scores               | n >= 2f + 3            |
| `bulyan`       | Krum selection, then a trimmed mean around the   | n >= 4f + 3            |
|                | median (El Mhamdi et al. 2018)                   |                        |
| `norm_bound`   | clip every update to L2 norm M, then the mean,   | no fixed f: it bounds  |
|                | optionally + N(0, sigma^2) (Sun et al. 2019)     | each client's pull     |

Papers: Blanchard, El Mhamdi, Guerraoui, Stainer 2017, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent" (Krum, Multi-Krum); El Mhamdi,
Guerraoui, Rouault 2018, "The Hidden Vulnerability of Distributed Learning in
Byzantium" (Bulyan); Yin, Chen, Ramchandran, Bartlett 2018, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates" (median, trimmed mean);
Sun, Kairouz, Suresh, McMahan 2019, "Can You Really Backdoor Federated Learning?"
(norm bounding, weak DP).

All rules are unweighted: a client's example count is its own unverified claim, and
one attacker claiming 10^7 examples would otherwise outweigh everyone (the papers'
rules are unweighted too). They need every update at once: n x d floats for n
updates of d parameters, plus a sorted copy for the coordinate-wise rules.

Each round checks the bound on the updates that actually arrived. When it fails
(dropouts left too few), the round still aggregates with the largest f the arrived
updates allow (`robust_f_applied`) and records `robust_bound_held: false`.

None of this is a sum: the sum-sensitivity DP accounting does not cover it and secure
aggregation cannot compute it, so the config refuses both (fedveil/config/run.py).
Weak DP is not a DP guarantee: its noise is seeded from the run seed (the same run
gives the same model) and no epsilon is accounted for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedveil.config import RunConfig
from fedveil.config.robust_bounds import bound_holds, largest_tolerated, trimmed_per_side
from fedveil.config.validator import ConfigError
from fedveil.server.engine.round_record import RoundRecord
from fedveil.tasks import Task

# The cohort's updates held at once, in float32 values (8 GiB; sorting doubles it).
MAX_HELD_FLOATS = 2**31


# -- the rules on a stacked (n, d) tensor of updates --------------------------
def coordinate_median(updates: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median (Yin et al. 2018); the mean of the two middle values for
    even n."""
    n = updates.shape[0]
    ordered = updates.sort(dim=0).values
    if n % 2:
        return ordered[n // 2].clone()
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(updates: torch.Tensor, k: int) -> torch.Tensor:
    """Coordinate-wise mean after dropping the k largest and k smallest values
    (Yin et al. 2018). Needs n >= 2k + 1."""
    n = updates.shape[0]
    if not 0 <= 2 * k < n:
        raise ValueError(f"trimmed mean: trimming {k} per side leaves nothing of {n} updates")
    ordered = updates.sort(dim=0).values
    return ordered[k : n - k].mean(dim=0)


def krum_scores(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score per update (Blanchard et al. 2017): the sum of squared distances to
    its n - f - 2 nearest other updates (at least 1 when n >= 2)."""
    return _scores(squared_distances(updates), f)


def squared_distances(updates: torch.Tensor) -> torch.Tensor:
    """The (n, n) squared L2 distances between updates, in float64, inf on the diagonal."""
    x = updates.double()
    dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
    return dist.fill_diagonal_(math.inf)


def _scores(dist: torch.Tensor, f: int) -> torch.Tensor:
    n = dist.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=dist.dtype, device=dist.device)
    neighbours = min(n - 1, max(1, n - f - 2))
    return dist.sort(dim=1).values[:, :neighbours].sum(dim=1)


def _best(scores: torch.Tensor, m: int) -> list[int]:
    values = scores.tolist()
    return sorted(range(len(values)), key=lambda i: (values[i], i))[:m]


def multi_krum_select(updates: torch.Tensor, f: int, m: int) -> list[int]:
    """The indices of the m updates with the lowest Krum scores (ties: lower index)."""
    return _best(krum_scores(updates, f), m)


def multi_krum(updates: torch.Tensor, f: int, m: int) -> torch.Tensor:
    """Multi-Krum (Blanchard et al. 2017): the mean of the m best-scored updates;
    m = 1 is Krum."""
    chosen = multi_krum_select(updates, f, m)
    return updates[sorted(chosen)].mean(dim=0)


def bulyan(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Bulyan (El Mhamdi et al. 2018) over Krum: pick theta = n - 2f updates one at a
    time, each the Krum winner among those left; then per coordinate average the
    beta = theta - 2f values closest to the selection's median. Needs n >= 4f + 3."""
    n = updates.shape[0]
    theta = n - 2 * f
    beta = theta - 2 * f
    if beta < 1:
        raise ValueError(f"bulyan: n = {n} updates are too few for f = {f} (needs n >= 4f + 3)")
    dist = squared_distances(updates)  # computed once; each pick scores what is left
    left = list(range(n))
    picked: list[int] = []
    while len(picked) < theta:
        best = _best(_scores(dist[left][:, left], f), 1)[0]
        picked.append(left.pop(best))
    chosen = updates[sorted(picked)]
    median = coordinate_median(chosen)
    closest = (chosen - median).abs().argsort(dim=0, stable=True)[:beta]
    return chosen.gather(0, closest).mean(dim=0)


def norm_bounded_mean(updates: torch.Tensor, bound: float) -> tuple[torch.Tensor, int]:
    """Every update clipped to L2 norm <= `bound`, then their mean (Sun et al. 2019);
    and how many had to be clipped."""
    norms = updates.double().norm(dim=1)
    scale = torch.clamp(bound / norms.clamp_min(1e-300), max=1.0).to(updates.dtype)
    clipped = int((norms > bound).sum())
    return (updates * scale.unsqueeze(1)).mean(dim=0), clipped


# -- the rule a run uses ----------------------------------------------------------
@dataclass(frozen=True)
class RobustResult:
    update: torch.Tensor
    report: dict[str, Any]


@dataclass(frozen=True)
class RobustAggregator:
    """One run's robust rule with its parameters (see the module table)."""

    name: str
    f: int = 0
    trim_fraction: float = 0.0
    krum_select: int = 0  # multi_krum: 0 means n - f
    norm_bound: float = 0.0
    weak_dp_noise: float = 0.0
    seed: int = 0

    def aggregate(self, updates: torch.Tensor, round_num: int) -> RobustResult:
        """The robust update from the (n, d) stacked updates, and the round's report:
        `robust_n`, `robust_f`, `robust_f_applied`, `robust_bound_held` (and what the
        rule did: `robust_selected`, `robust_clipped`, `weak_dp_noise`)."""
        n = updates.shape[0]
        held = bound_holds(self.name, n, self.f, self.trim_fraction)
        f = largest_tolerated(self.name, n, self.f, self.trim_fraction)
        report: dict[str, Any] = {
            "aggregator": self.name,
            "robust_n": n,
            "robust_f": self.f,
            "robust_f_applied": f,
            "robust_bound_held": held,
        }
        if self.name == "median":
            out = coordinate_median(updates)
        elif self.name == "trimmed_mean":
            k = min(trimmed_per_side(n, f, self.trim_fraction), (n - 1) // 2)
            report["robust_trimmed"] = k
            out = trimmed_mean(updates, k)
        elif self.name in ("krum", "multi_krum"):
            m = 1 if self.name == "krum" else (self.krum_select or n - f)
            m = max(1, min(m, n - f))
            report["robust_selected"] = m
            out = multi_krum(updates, f, m)
        elif self.name == "bulyan":
            out = bulyan(updates, f)
        elif self.name == "norm_bound":
            out, clipped = norm_bounded_mean(updates, self.norm_bound)
            report["robust_clipped"] = clipped
            if self.weak_dp_noise > 0:
                out = out + self.weak_dp_noise * self._noise(out.numel(), round_num).to(out)
                report["weak_dp_noise"] = self.weak_dp_noise
        else:
            raise ValueError(f"server.aggregator = {self.name!r}: unknown")
        return RobustResult(out, report)

    def _noise(self, size: int, round_num: int) -> torch.Tensor:
        # Seeded from the run seed and the round, so a run repeats bit for bit. Weak DP
        # is a defence against backdoors, not a privacy guarantee: the server knows it.
        state = np.random.SeedSequence([self.seed, 0x5EA7, round_num]).generate_state(2)
        gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        return torch.randn(size, generator=gen, dtype=torch.float64)


def robust_aggregator(cfg: RunConfig, task: Task | None = None) -> RobustAggregator | None:
    """The run's robust rule, None for `server.aggregator = 'mean'` (the plain weighted
    sum). With the `task`, refuses a cohort whose updates would not fit in memory."""
    s = cfg.server
    if s.aggregator == "mean":
        return None
    if task is not None:
        model_size = sum(p.numel() for p in task.model_fn().parameters())
        cohort = s.per_round if s.sampling == "fixed" else cfg.poisson_rate * cfg.data.num_clients
        if cohort * model_size > MAX_HELD_FLOATS:
            raise ConfigError(
                f"server.aggregator = {s.aggregator!r} holds every update of a round: "
                f"{cohort:g} clients x {model_size} parameters exceeds {MAX_HELD_FLOATS} "
                "floats; lower server.per_round (or server.sample_rate)"
            )
    return RobustAggregator(
        s.aggregator,
        s.attackers_tolerated,
        s.trim_fraction,
        s.krum_select,
        s.norm_bound,
        s.weak_dp_noise,
        cfg.seed,
    )


def robust_summary(aggregator: str, history: Sequence[RoundRecord]) -> dict[str, Any]:
    """The run summary's robust facts: the aggregator and in how many rounds its bound
    did not hold on the updates that arrived (nothing for the mean)."""
    if aggregator == "mean":
        return {}
    failed = sum(r.extra.get("robust_bound_held") is False for r in history)
    return {"aggregator": aggregator, "robust_bound_failed_rounds": failed}
