"""ROC curves of a membership attack, and the region an (epsilon, delta) guarantee allows.

A mechanism that is (eps, delta)-DP caps every test between neighbouring datasets
(Kairouz et al. 2015): TPR <= e^eps * FPR + delta, and, from the complementary test,
1 - FPR <= e^eps * (1 - TPR) + delta. An empirical ROC above either line either refutes
the claim or is sampling noise: `bound_violations` reports both the raw points and those
whose Clopper-Pearson intervals still cross the line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Roc:
    """Points of an ROC curve, from the strictest threshold to the loosest."""

    fpr: np.ndarray
    tpr: np.ndarray
    positives: int
    negatives: int


def roc_curve(scores: np.ndarray, members: np.ndarray) -> Roc:
    """One point per distinct score (ties move together), starting at (0, 0)."""
    scores, members = np.asarray(scores, dtype=float), np.asarray(members, dtype=bool)
    _check_both_classes(members)
    order = np.argsort(-scores, kind="stable")
    s, m = scores[order], members[order]
    last_of_tie = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tp, fp = np.cumsum(m)[last_of_tie], np.cumsum(~m)[last_of_tie]
    pos, neg = int(m.sum()), int((~m).sum())
    return Roc(np.r_[0.0, fp / neg], np.r_[0.0, tp / pos], pos, neg)


def roc_auc(scores: np.ndarray, members: np.ndarray) -> float:
    """P(score of a member > score of a non-member), ties counting one half (Mann-Whitney)."""
    scores, members = np.asarray(scores, dtype=float), np.asarray(members, dtype=bool)
    _check_both_classes(members)
    ranks = _average_ranks(scores)
    pos, neg = int(members.sum()), int((~members).sum())
    return float((ranks[members].sum() - pos * (pos + 1) / 2) / (pos * neg))


def tpr_at_fpr(roc: Roc, fpr: float) -> float:
    """The best TPR among thresholds whose FPR is at most `fpr`."""
    ok = roc.fpr <= fpr + 1e-12
    return float(roc.tpr[ok].max())


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _check_both_classes(members: np.ndarray) -> None:
    if members.all() or not members.any():
        raise ValueError(
            f"membership labels: need members and non-members; got {int(members.sum())} "
            f"members of {len(members)}"
        )


def bound_tpr(fpr: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The largest TPR (eps, delta)-DP allows at each FPR (both inequalities)."""
    fpr = np.asarray(fpr, dtype=float)
    e = math.exp(min(epsilon, 700.0))
    upper = np.minimum(e * fpr + delta, 1.0 - (1.0 - fpr - delta) / e)
    return np.clip(upper, 0.0, 1.0)


@dataclass
class BoundCheck:
    """ROC points above the DP bound: `points` as measured, `significant` at 95% (the
    Clopper-Pearson lower TPR still above the bound at the upper FPR)."""

    epsilon: float
    delta: float
    points: list[dict[str, float]]
    significant: list[dict[str, float]]

    def to_json(self) -> dict[str, object]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "violations": len(self.points),
            "significant_violations": len(self.significant),
            "violating_points": self.points[:20],
            "significant_points": self.significant[:20],
        }


def bound_violations(roc: Roc, epsilon: float, delta: float) -> BoundCheck:
    """Every ROC point checked against TPR <= e^eps*FPR + delta (and its complement)."""
    tol = 1e-12
    limit = bound_tpr(roc.fpr, epsilon, delta)
    points, significant = [], []
    for f, t, lim in zip(roc.fpr, roc.tpr, limit, strict=True):
        if t <= lim + tol:
            continue
        point = {"fpr": float(f), "tpr": float(t), "bound_tpr": float(lim)}
        points.append(point)
        tp, fp = round(t * roc.positives), round(f * roc.negatives)
        t_lo = clopper_pearson(tp, roc.positives, 0.05)[0]
        f_hi = clopper_pearson(fp, roc.negatives, 0.05)[1]
        if t_lo > float(bound_tpr(np.array([f_hi]), epsilon, delta)[0]) + tol:
            significant.append(point)
    return BoundCheck(epsilon, delta, points, significant)


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided (1 - alpha) interval for a binomial proportion k/n (bisection on
    the binomial tail: no SciPy in the core install)."""
    lo = 0.0 if k == 0 else _bisect(lambda p: _binom_sf(k, n, p) - alpha / 2)
    hi = 1.0 if k == n else _bisect(lambda p: alpha / 2 - _binom_cdf(k, n, p))
    return lo, hi


def _bisect(f: object) -> float:
    a, b = 0.0, 1.0
    for _ in range(60):  # f increases in p; 60 halvings are below float precision
        mid = (a + b) / 2
        if f(mid) < 0:  # type: ignore[operator]
            a = mid
        else:
            b = mid
    return (a + b) / 2


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Bin(n, p)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    logs = [c + i * lp + (n - i) * lq for i, c in enumerate(terms)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def _binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k)."""
    return 1.0 - _binom_cdf(k - 1, n, p) if k > 0 else 1.0


def plot_roc(
    curves: dict[str, Roc], path: Path, *, epsilon: float | None, delta: float, title: str
) -> Path:
    """The ROC curves against the DP bound: a PNG with matplotlib, else an SVG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg_roc(curves, path.with_suffix(".svg"), epsilon=epsilon, delta=delta)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    grid = np.logspace(-4, 0, 400)
    for ax, log in zip(axes, (False, True), strict=True):
        for name, roc in curves.items():
            ax.step(
                np.maximum(roc.fpr, 1e-4) if log else roc.fpr, roc.tpr, where="post", label=name
            )
        ax.plot(grid, grid, ":", color="grey", label="chance")
        if epsilon is not None:
            ax.plot(
                grid,
                bound_tpr(grid, epsilon, delta),
                "--",
                color="red",
                label=f"DP bound (eps={epsilon:.3g}, delta={delta:.0e})",
            )
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(1e-4, 1)
            ax.set_ylim(1e-4, 1.05)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = path.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _svg_roc(curves: dict[str, Roc], path: Path, *, epsilon: float | None, delta: float) -> Path:
    size, colours = 400, ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]

    def pts(x: np.ndarray, y: np.ndarray) -> str:
        return " ".join(
            f"{20 + a * size:.1f},{20 + (1 - b) * size:.1f}" for a, b in zip(x, y, strict=True)
        )

    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 40}" height="{size + 40}">',
        f'<rect x="20" y="20" width="{size}" height="{size}" fill="none" stroke="black"/>',
        f'<polyline points="{pts(np.array([0, 1]), np.array([0, 1]))}" stroke="grey" '
        'stroke-dasharray="2,3" fill="none"/>',
    ]
    if epsilon is not None:
        g = np.linspace(0, 1, 200)
        lines.append(
            f'<polyline points="{pts(g, bound_tpr(g, epsilon, delta))}" stroke="red" '
            'stroke-dasharray="6,4" fill="none"/>'
        )
    for (name, roc), colour in zip(curves.items(), colours, strict=False):
        lines.append(
            f'<polyline points="{pts(roc.fpr, roc.tpr)}" stroke="{colour}" '
            f'fill="none"><title>{name}</title></polyline>'
        )
    lines.append("</svg>")
    path.write_text("\n".join(lines) + "\n")
    return path
