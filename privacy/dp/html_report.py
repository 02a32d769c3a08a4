"""One self-contained HTML page for a privacy report: inline CSS and SVG only."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from .svg_chart import Series, line_chart

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 900px; margin: 2em auto; color: #222;
       padding: 0 1em; line-height: 1.45; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
h3 { font-size: 1em; margin-bottom: .3em; }
table.summary { border-collapse: collapse; }
table.summary td, table.summary th { border: 1px solid #ccc; padding: 4px 10px;
       text-align: left; }
.headline { background: #f3f6fa; padding: .6em 1em; border-radius: 6px; margin: .6em 0; }
.headline .who { font-size: .85em; text-transform: uppercase; letter-spacing: .04em;
       color: #57606a; }
.headline .figure { font-size: 1.2em; margin: .15em 0; }
.headline .note { font-size: .92em; color: #333; }
.param { font-size: 1.05em; }
table.summary td { vertical-align: top; overflow-wrap: anywhere; }
table.summary th { white-space: nowrap; }
.ok { color: #1a7f37; } .bad { color: #b42318; }
.operator { background: #fff4e5; border: 1px solid #d97706; padding: .6em 1em;
       border-radius: 6px; }
svg.chart { display: block; margin: 1em 0; background: #fff; }
svg .axis { stroke: #444; } svg .grid { stroke: #e5e5e5; }
svg .tick, svg .legend, svg .axis-label { font-size: 11px; fill: #333; }
svg .chart-title { font-size: 13px; font-weight: 600; fill: #222; }
"""

_LABELS = {
    "mechanism": "Mechanism",
    "noise_multiplier": "Noise multiplier z",
    "privacy_unit": "Privacy unit",
    "neighbouring": "Neighbouring relation",
    "neighbouring_protects": "What the relation protects",
    "sampling": "Sampling",
    "sampling_rate": "Sampling rate q",
    "cohort_source": "Cohort source",
    "accountant": "Accountant",
    "rounds": "Released rounds",
    "delta": "Delta",
    "budget_epsilon": "Epsilon budget",
    "budget_against": "Budget applies to",
    "ledger_head_hash": "Ledger head hash",
}


def render_html(report: Mapping[str, Any]) -> str:
    """Render `build_report`'s dict as a standalone page (no scripts, no external URLs)."""
    series = report["series"]
    rounds = [float(r) for r in series["round"]]
    budget = float(report["budget_epsilon"])
    lines = [
        Series("observers' epsilon", _floats(series["epsilon"]), "#1f6feb"),
        Series("budget", [budget] * len(rounds), "#b42318", dashed=True),
    ]
    if "epsilon_coordinator_bound" in series:  # public: a client in every round
        bound = _floats(series["epsilon_coordinator_bound"])
        lines.insert(1, Series("coordinator bound", bound, "#9a6700"))
    if "epsilon_coordinator_max" in series:  # the operator's report only: realised
        realised = _floats(series["epsilon_coordinator_max"])
        lines.insert(2, Series("coordinator max (realised)", realised, "#6e7781"))
    noise_only = set(report.get("noise_only_rounds", []))  # the operator's report only
    if noise_only:
        epsilons = _floats(series["epsilon"])
        marks = [
            e if int(r) in noise_only else math.nan for r, e in zip(rounds, epsilons, strict=True)
        ]
        lines.append(Series("noise-only round", marks, "#d97706", markers=True))
    epsilon_chart = line_chart("Cumulative epsilon vs budget", rounds, lines, "epsilon")
    clip_chart = line_chart(
        "Clip norm per round",
        rounds,
        [Series("clip norm C", _floats(series["clip_norm"]), "#8250df")],
        "C",
    )
    adversaries = report.get("adversaries", {})
    body = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>fedveil privacy report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Differential privacy report</h1>",
        _operator_banner(report),
        "<h2>One guarantee per adversary</h2>",
        _observers(report, adversaries.get("observers", {})),
        _coordinator(report, adversaries.get("coordinator", {})),
        _cohort_members(adversaries.get("cohort_members", {})),
        f'<p class="param">Noise multiplier <b>z = {float(report["noise_multiplier"]):.4g}</b>'
        " (noise standard deviation / clip norm).</p>",
        f"<p><b>Sampling.</b> {escape(str(report.get('sampling_statement', '')))}</p>"
        if report.get("sampling_statement")
        else "",
        _noise_only(report),
        _ledger_state(report),
        _verification(report.get("verification")),
        "<h2>Parameters</h2>",
        _summary_table(report),
        _distribution(adversaries.get("coordinator", {}).get("distribution")),
        "<h2>Published statistics and how each is protected</h2>",
        _published(report.get("published_statistics", [])),
        f"<p><b>Sensitivity.</b> {escape(str(report['sensitivity']))}</p>"
        if report.get("sensitivity")
        else "",
        "<h2>Privacy spent</h2>",
        epsilon_chart,
        "<h2>Clipping</h2>",
        clip_chart,
        "<h2>Assumptions</h2>",
        _assumptions(report["assumptions"]),
        "</body></html>",
    ]
    return "\n".join(part for part in body if part)


def _operator_banner(report: Mapping[str, Any]) -> str:
    if report.get("view") != "operator":
        return ""
    return (
        '<p class="operator"><b>Operator\'s view.</b> Built from the private annex: it '
        "marks rounds by whether any client's update survived and, under distributed DP, "
        "gives each client's epsilon against the coordinator and how many clients took "
        "part, all of which reveal participation. Keep it with the admin token; publish "
        "privacy/report.html instead.</p>"
    )


def _noise_only(report: Mapping[str, Any]) -> str:
    """Noise-only rounds: listed (operator's view) or where to find them (public)."""
    statement = report.get("noise_only_rounds_statement")
    if not statement:
        return ""
    css = ' class="bad"' if report.get("noise_only_rounds") else ""
    return f"<p{css}><b>Noise-only rounds.</b> {escape(str(statement))}</p>"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _floats(values: list[Any]) -> list[float]:
    return [math.nan if value is None else float(value) for value in values]


def _observers(report: Mapping[str, Any], observers: Mapping[str, Any]) -> str:
    budget = float(report["budget_epsilon"])
    applies = " (the budget applies here)" if report.get("budget_against") != "coordinator" else ""
    holds = "; ".join(str(item) for item in observers.get("holds_if", []))
    return (
        '<div class="headline"><div class="who">Observers of what is published</div>'
        f'<div class="figure">(&epsilon; = {float(report["epsilon"]):.4g}, &delta; = '
        f"{float(report['delta']):.3g}) for each {escape(str(report['privacy_unit']))}, "
        f"budget &epsilon; = {budget:.4g}{applies}</div>"
        + (f'<div class="note">Holds if: {escape(holds)}.</div>' if holds else "")
        + "</div>"
    )


def _coordinator(report: Mapping[str, Any], coordinator: Mapping[str, Any]) -> str:
    title = '<div class="who">The coordinator</div>'
    if not coordinator:
        return ""
    if "epsilon_bound" not in coordinator:
        statement = escape(_sentence(str(coordinator.get("statement", ""))))
        return f'<div class="headline">{title}<div class="figure">{statement}</div></div>'
    bound = coordinator["epsilon_bound"]
    budget = float(report["budget_epsilon"])
    delta = float(coordinator.get("delta", report["delta"]))
    applies = " (the budget applies here)" if report.get("budget_against") == "coordinator" else ""
    if bound is None:
        figure = f"no bound: {escape(str(coordinator.get('bound_error', 'unknown')))}"
    else:
        # Under a participation cap (asynchronous DP) the bound is for P releases.
        who = "a client in every released round"
        if "participation" in report:
            who = escape(str(coordinator.get("bound", who)))
        figure = (
            f"at most &epsilon; = {float(bound):.4g}, &delta; = {delta:.3g}, for any client "
            f"({who}){applies}"
        )
    accounting = escape(str(coordinator.get("accounting", "")))
    if report.get("view") != "operator":
        note = f"{escape(str(coordinator.get('per_client', '')))} Accounting: {accounting}."
        return f'<div class="headline">{title}<div class="figure">{figure}</div>' + (
            f'<div class="note">{note}</div></div>'
        )
    maximum = coordinator.get("epsilon_max")
    over = (
        f" (above the budget {budget:.4g}, which caps the observers' figure)"
        if report.get("budget_against") != "coordinator"
        and maximum is not None
        and float(maximum) > budget
        else ""
    )
    realised = (
        "not recorded"
        if maximum is None
        else f"largest per-client &epsilon; = {float(maximum):.4g}{over}"
    )
    distribution = coordinator.get("distribution")
    spread = (
        f"median {float(distribution['p50']):.4g}, 90th percentile "
        f"{float(distribution['p90']):.4g} over {int(distribution['clients'])} clients that "
        "took part"
        if distribution
        else "no per-client distribution: the annex has no charge records"
    )
    return (
        f'<div class="headline">{title}<div class="figure">{figure}</div>'
        f'<div class="figure">Operator\'s view: {realised}</div>'
        f'<div class="note">{escape(spread)}; {accounting}. Do not publish: it reveals '
        "participation.</div></div>"
    )


def _cohort_members(members: Mapping[str, Any]) -> str:
    if not members:
        return ""
    return (
        '<div class="headline"><div class="who">Cohort members</div>'
        f'<div class="note">{escape(str(members.get("sees", "")))} What holds against them: '
        f"{escape(str(members.get('bound', '')))}.</div></div>"
    )


def _ledger_state(report: Mapping[str, Any]) -> str:
    state = report.get("ledger_state")
    if not state:
        return ""
    css = "ok" if state == "final" else "bad"
    return f'<p>Ledger state: <b class="{css}">{escape(str(state))}</b></p>'


def _distribution(distribution: Mapping[str, Any] | None) -> str:
    if not distribution:
        return ""
    rows = "".join(
        f"<tr><td>{_range(row['lo'], row['hi'])}</td><td>{int(row['clients'])}</td></tr>"
        for row in distribution.get("histogram", [])
        if int(row["clients"])
    )
    return (
        "<h2>The coordinator's epsilon per client</h2>"
        f"<p>{int(distribution['clients'])} clients took part; largest "
        f"{float(distribution['max']):.4g}, median {float(distribution['p50']):.4g}, "
        f"90th percentile {float(distribution['p90']):.4g}.</p>"
        '<table class="summary"><tr><th>&epsilon; per client</th><th>clients</th></tr>'
        f"{rows}</table>"
    )


def _range(lo: float, hi: float) -> str:
    if math.isinf(float(lo)):
        return "unbounded"
    return f"{float(lo):.3g} &ndash; {float(hi):.3g}"


def _published(statistics: list[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{escape(str(item['name']))}</td><td>{escape(str(item['protection']))}</td></tr>"
        for item in statistics
    )
    return f'<table class="summary"><tr><th>statistic</th><th>protection</th></tr>{rows}</table>'


def _summary_table(report: Mapping[str, Any]) -> str:
    rows = "".join(
        f"<tr><th>{escape(label)}</th><td>{escape(_value(report[key]))}</td></tr>"
        for key, label in _LABELS.items()
        if key in report and report[key] is not None
    )
    return f'<table class="summary">{rows}</table>'


def _value(value: Any) -> str:
    # z and q as read, not as binary floating point prints them (2.4021667092236263)
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _verification(verification: Mapping[str, Any] | None) -> str:
    if not verification:
        return "<p>Ledger not verified in this report.</p>"
    css = "ok" if verification["ok"] else "bad"
    message = escape(str(verification["message"]))
    if verification["ok"]:
        return f'<p class="{css}">Verified: {message}</p>'
    if verification.get("status") == "interrupted":
        return f'<p class="{css}">Verified up to an interruption: {message}</p>'
    return f'<p class="{css}">Ledger FAILED verification: {message}</p>'


def _assumptions(assumptions: Mapping[str, list[str]]) -> str:
    sections = [
        ("Who sees what", "who_sees_what"),
        ("Who is trusted with what", "trust"),
        ("What is protected", "protected"),
        ("What is not protected", "not_protected"),
    ]
    html = []
    for title, key in sections:
        items = "".join(f"<li>{escape(text)}</li>" for text in assumptions.get(key, []))
        if items:
            html.append(f"<h3>{escape(title)}</h3><ul>{items}</ul>")
    return "\n".join(html)


# -- canary audits (`fedveil privacy audit`) ------------------------------------------


def audit_html(section: Mapping[str, Any]) -> str:
    """The audit's part of a page: the three epsilons side by side, each explained, the
    verdict, the canaries' cohort share and their score histograms (SVG)."""
    explained = section.get("explained", {})
    interval = section.get("estimated_epsilon_interval")
    estimate = section.get("estimated_epsilon")
    accounted = section.get("accounted_epsilon")
    cells = [
        (
            "Accounted epsilon (upper bound)",
            "none (no DP)" if accounted is None else f"{float(accounted):.4g}",
            explained.get("accounted", ""),
        ),
        (
            "Estimated epsilon",
            "n/a"
            if estimate is None
            else f"{float(estimate):.4g}"
            + ("" if not interval else f" ({interval[0]:.3g} to {interval[1]:.3g})"),
            explained.get("estimated", ""),
        ),
        (
            f"Lower bound (f-DP, {float(section.get('lower_bound_confidence') or 0.99):.0%})",
            f"{float(section.get('lower_bound_epsilon') or 0.0):.4g}"
            + (
                ""
                if section.get("ceiling_epsilon") is None
                else f" (ceiling {float(section['ceiling_epsilon']):.3g})"
            ),
            explained.get("lower_bound", ""),
        ),
    ]
    row = "".join(
        f'<td><div class="who">{escape(who)}</div><div class="figure"><b>{escape(fig)}</b>'
        f'</div><div class="note">{escape(note)}</div></td>'
        for who, fig, note in cells
    )
    cls = "bad" if section.get("refuted") else "ok"
    shares = [float(c["canary_share"]) for c in section.get("cohorts", [])]
    share_text = (
        f"Canaries made {min(shares):.1%} to {max(shares):.1%} of each cohort "
        f"({section.get('canaries_inserted')} of {section.get('canaries')} inserted)."
        if shares
        else f"Canaries are expected to make {float(section.get('canary_share_expected') or 0):.1%}"
        " of each cohort (users and canaries are sampled at the same rate; under DP each "
        "cohort's realised make-up is participation, kept in the operator's private files)."
    )
    charts = [_histogram_chart(name, hist) for name, hist in section.get("histograms", {}).items()]
    return "\n".join(
        [
            "<h2>Canary audit: three epsilons</h2>",
            f'<table class="summary headline audit"><tr>{row}</tr></table>',
            f'<p class="{cls}"><b>{escape(str(section.get("verdict", "")))}</b></p>',
            f"<p>{escape(share_text)}</p>",
            "<h3>Canary statistics (each canary's projection, summed over rounds)</h3>",
            *charts,
        ]
    )


def _histogram_chart(name: str, hist: Mapping[str, Any]) -> str:
    edges = _floats(hist["edges"])
    centres = [(edges[i] + edges[i + 1]) / 2 for i in range(len(edges) - 1)]
    title = {
        "final_model": "Final model",
        "all_rounds": "All rounds (max over rounds)",
        "projection_sum": "Sum over rounds of the projection",
    }.get(name, name)
    return line_chart(
        f"{title}: canary score histogram",
        centres,
        [
            Series("inserted", [float(v) for v in hist["inserted"]], "#b42318"),
            Series("held out", [float(v) for v in hist["held_out"]], "#1f6feb"),
        ],
        "canaries",
        x_label="canary score",  # not rounds: each bin of the statistic
    )


def join_audit(page: str, section: Mapping[str, Any]) -> str:
    """`page` with the canary audit's part added before its end (after any attacks' part),
    after a fragment that has no end, or a page of its own when there is nothing to join
    (a run without DP)."""
    end = "</body></html>"
    if end in page:
        return page.replace(end, audit_html(section) + "\n" + end, 1)
    if page:
        return page + "\n" + audit_html(section)
    return render_audit_page(section)


def render_audit_page(section: Mapping[str, Any]) -> str:
    """A standalone page for an audit with no DP report to join (a run without DP)."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            "<title>fedveil privacy audit</title>",
            f"<style>{_CSS}</style></head><body>",
            "<h1>Privacy audit</h1>",
            audit_html(section),
            "</body></html>",
        ]
    )


# -- attacks (`fedveil privacy attack ...`; the section from report.attacks_section) ----

_IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}
_ATTACK_TITLES = {
    "update_inversion": "Update inversion",
    "membership": "Membership inference",
    "model_inversion": "Model inversion",
}


def attacks_html(section: Mapping[str, Any], privacy_dir: Path) -> str:
    """The attacks' part of a page: per attack, what it found in plain words and its
    figures, embedded as data: URIs (the page stays self-contained: the report's CSP
    allows images from data: only)."""
    explained = section.get("explained", {})
    parts = ["<h2>Attacks on this run</h2>"]
    for entry in section.get("found", []):
        kind = str(entry.get("kind", ""))
        parts.append(f"<h3>{escape(_ATTACK_TITLES.get(kind, kind))}: {escape(entry['name'])}</h3>")
        parts.append(f'<p class="note">{escape(explained.get(kind, ""))}</p>')
        parts.append(f"<p><b>{escape(str(entry.get('statement', '')))}</b></p>")
        for figure in entry.get("figures", []):
            parts.append(_embedded_image(Path(privacy_dir) / figure, figure))
    return "\n".join(parts)


def _embedded_image(path: Path, label: str) -> str:
    mime = _IMAGE_TYPES.get(path.suffix.lower())
    if mime is None or not path.is_file():
        return f"<p>{escape(label)}: missing</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'<figure><img src="data:{mime};base64,{data}" alt="{escape(label)}" '
        f'style="max-width:100%"><figcaption>{escape(label)}</figcaption></figure>'
    )


def join_attacks(page: str, section: Mapping[str, Any], privacy_dir: Path) -> str:
    """`page` with the attacks' part added before its end (or a page of its own when
    there is no report to join: a run without DP)."""
    body = attacks_html(section, privacy_dir)
    end = "</body></html>"
    if end in page:
        return page.replace(end, body + "\n" + end, 1)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            "<title>fedveil privacy attacks</title>",
            f"<style>{_CSS}</style></head><body>",
            "<h1>Privacy under attack</h1>",
            body,
            end,
        ]
    )
