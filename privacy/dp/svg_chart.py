"""Minimal inline-SVG line charts (no JavaScript, no external assets)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 34, 40


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float]
    colour: str
    dashed: bool = False
    markers: bool = False  # rings at the values, no line (marks rounds on another series)


def line_chart(
    title: str,
    xs: Sequence[float],
    series: Sequence[Series],
    y_label: str,
    x_label: str = "round",
) -> str:
    """An SVG element plotting each series against `xs` (rounds, unless `x_label` says
    otherwise), with axes and legend."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for s in series for v in s.values if math.isfinite(v)]
    y_min = min([0.0, *values])
    y_max = max([y_min, *values])
    y_max = y_min + 1.0 if y_max <= y_min else y_min + (y_max - y_min) * 1.1
    x_min, x_max = (min(xs), max(xs)) if xs else (0.0, 1.0)
    x_span = (x_max - x_min) or 1.0

    def px(x: float) -> float:
        return LEFT + (x - x_min) / x_span * plot_w if len(xs) > 1 else LEFT + plot_w / 2

    def py(y: float) -> float:
        return TOP + plot_h - (y - y_min) / (y_max - y_min) * plot_h

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="20" class="chart-title">{escape(title)}</text>',
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" class="axis-label" '
        f'text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="14" y="{TOP + plot_h / 2}" class="axis-label" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2})">{escape(y_label)}</text>',
    ]
    for k in range(5):
        y = y_min + (y_max - y_min) * k / 4
        parts.append(
            f'<line x1="{LEFT - 4}" y1="{py(y):.1f}" x2="{LEFT + plot_w}" '
            f'y2="{py(y):.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" class="tick" '
            f'text-anchor="end">{_fmt(y)}</text>'
        )
    parts.append(
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" '
        f'y2="{TOP + plot_h}" class="axis"/>'
    )  # axes drawn over the grid
    parts.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>')
    for x in _x_ticks(xs):
        parts.append(
            f'<text x="{px(x):.1f}" y="{TOP + plot_h + 16}" class="tick" '
            f'text-anchor="middle">{_fmt(x)}</text>'
        )
    for index, s in enumerate(series):
        points = [(px(x), py(y)) for x, y in zip(xs, s.values, strict=True) if math.isfinite(y)]
        parts += _drawn(s, points) + _legend(s, TOP + 14 + 18 * index)
    parts.append("</svg>")
    return "\n".join(parts)


def _drawn(s: Series, points: list[tuple[float, float]]) -> list[str]:
    """One series' marks: a line with its points, or rings only (`markers`)."""
    if s.markers:
        return [
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="none" stroke="{s.colour}" '
            'stroke-width="2"/>'
            for x, y in points
        ]
    parts = []
    if len(points) > 1:
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{s.colour}" '
            f'stroke-width="2"{_dash(s)}/>'
        )
    for x, y in points if len(points) <= 60 else []:
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{s.colour}"/>')
    return parts


def _legend(s: Series, legend_y: float) -> list[str]:
    swatch = (
        f'<circle cx="{WIDTH - RIGHT + 22}" cy="{legend_y - 4}" r="5" fill="none" '
        f'stroke="{s.colour}" stroke-width="2"/>'
        if s.markers
        else f'<line x1="{WIDTH - RIGHT + 12}" y1="{legend_y - 4}" '
        f'x2="{WIDTH - RIGHT + 32}" y2="{legend_y - 4}" stroke="{s.colour}" '
        f'stroke-width="2"{_dash(s)}/>'
    )
    label = f'<text x="{WIDTH - RIGHT + 36}" y="{legend_y}" class="legend">{escape(s.label)}</text>'
    return [swatch, label]


def _dash(s: Series) -> str:
    return ' stroke-dasharray="6 4"' if s.dashed else ""


def _x_ticks(xs: Sequence[float]) -> list[float]:
    if not xs:
        return []
    stride = max(1, math.ceil(len(xs) / 8))
    picked = list(range(0, len(xs), stride))
    if picked[-1] != len(xs) - 1:
        # The last x is always labelled; one less than half a stride before it would
        # print over it (the audit's histogram read "0.05374"): it takes that place.
        if len(xs) - 1 - picked[-1] < stride / 2:
            picked[-1] = len(xs) - 1
        else:
            picked.append(len(xs) - 1)
    return [xs[i] for i in picked]


def _fmt(value: float) -> str:
    return f"{value:.3g}"
