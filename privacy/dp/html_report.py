"""One self-contained HTML page for a privacy report: inline CSS and SVG only."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from .svg_chart import Series, line_chart

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 900px; margin: 2em auto; color: #222;
       padding: 0 1em; line-height: 1.45; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table.summary { border-collapse: collapse; }
table.summary td, table.summary th { border: 1px solid #ccc; padding: 4px 10px;
       text-align: left; }
.headline { font-size: 1.2em; background: #f3f6fa; padding: .6em 1em; border-radius: 6px; }
.ok { color: #1a7f37; } .bad { color: #b42318; }
svg.chart { display: block; margin: 1em 0; background: #fff; }
svg .axis { stroke: #444; } svg .grid { stroke: #e5e5e5; }
svg .tick, svg .legend, svg .axis-label { font-size: 11px; fill: #333; }
svg .chart-title { font-size: 13px; font-weight: 600; fill: #222; }
"""

_LABELS = {
    "mechanism": "Mechanism",
    "privacy_unit": "Privacy unit",
    "neighbouring": "Neighbouring relation",
    "sampling": "Sampling",
    "sampling_rate": "Sampling rate",
    "accountant": "Accountant",
    "rounds": "Released rounds",
    "delta": "Delta",
    "budget_epsilon": "Epsilon budget",
    "ledger_head_hash": "Ledger head hash",
}


def render_html(report: Mapping[str, Any]) -> str:
    """Render `build_report`'s dict as a standalone page (no scripts, no external URLs)."""
    series = report["series"]
    rounds = [float(r) for r in series["round"]]
    budget = float(report["budget_epsilon"])
    epsilon_chart = line_chart(
        "Cumulative epsilon vs budget",
        rounds,
        [
            Series("epsilon", series["epsilon"], "#1f6feb"),
            Series("budget", [budget] * len(rounds), "#b42318", dashed=True),
        ],
        "epsilon",
    )
    clip_chart = line_chart(
        "Clip norm per round", rounds, [Series("clip norm C", series["clip_norm"], "#8250df")], "C"
    )
    participation_chart = line_chart(
        "Participation per round",
        rounds,
        [
            Series("planned", series["cohort_planned"], "#9a6700", dashed=True),
            Series("aggregated", series["cohort_aggregated"], "#1a7f37"),
        ],
        "clients",
    )
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>fedveil privacy report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Differential privacy report</h1>",
        f'<p class="headline">(&epsilon; = {report["epsilon"]:.4g}, &delta; = '
        f"{report['delta']:.3g}) for each {escape(str(report['privacy_unit']))}, "
        f"budget &epsilon; = {budget:.4g}.</p>",
        _verification(report.get("verification")),
        "<h2>Parameters</h2>",
        _summary_table(report),
        "<h2>Privacy spent</h2>",
        epsilon_chart,
        "<h2>Clipping</h2>",
        clip_chart,
        "<h2>Participation</h2>",
        participation_chart,
        "<h2>Assumptions</h2>",
        _assumptions(report["assumptions"]),
        "</body></html>",
    ]
    return "\n".join(part for part in body if part)


def _summary_table(report: Mapping[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{escape(label)}</th><td>{escape(str(report[key]))}</td></tr>"
        for key, label in _LABELS.items()
        if key in report
    )
    return f'<table class="summary">{rows}</table>'


def _verification(verification: Mapping[str, Any] | None) -> str:
    if not verification:
        return "<p>Ledger not verified in this report.</p>"
    css = "ok" if verification["ok"] else "bad"
    if verification["ok"]:
        # The verifier's message already reads "ledger verified: ...".
        return f'<p class="{css}">{escape(str(verification["message"]).capitalize())}</p>'
    message = escape(str(verification["message"]))
    return f'<p class="{css}">Ledger FAILED verification: {message}</p>'


def _assumptions(assumptions: Mapping[str, list[str]]) -> str:
    sections = [
        ("Who is trusted with what", "trust"),
        ("What is protected", "protected"),
        ("What is not protected", "not_protected"),
    ]
    html = []
    for title, key in sections:
        items = "".join(f"<li>{escape(text)}</li>" for text in assumptions.get(key, []))
        html.append(f"<h3>{escape(title)}</h3><ul>{items}</ul>")
    return "\n".join(html)
