import json
import re

from fedveil.privacy.dp import DpConfig, Ledger, build_report, render_html, verify_ledger


def test_report_json_has_the_guarantee_and_per_round_series(make_ledger):
    path, cfg, budget = make_ledger(rounds=5)
    entries = Ledger(path).entries  # releases and the closing record
    report = build_report(entries, verification=verify_ledger(path))
    assert report["epsilon"] == Ledger(path).releases[-1]["epsilon"] == budget.spent()
    assert report["rounds"] == 5 and report["ledger_entries"] == 6
    assert report["delta"] == cfg.delta and report["budget_epsilon"] == cfg.budget_epsilon
    for key, value in [
        ("mechanism", "central_gaussian"),
        ("sampling", "poisson"),
        ("privacy_unit", "user"),
        ("neighbouring", "add_remove"),
        ("accountant", "rdp"),
    ]:
        assert report[key] == value
    assert report["series"]["round"] == [1, 2, 3, 4, 5]
    assert set(report["series"]) == {"round", "epsilon", "clip_norm", "noise_multiplier"}
    assert report["ledger_state"] == "final"
    assert report["noise_multiplier"] == cfg.noise_multiplier
    assert report["ledger_head_hash"] == Ledger(path).head_hash
    assert report["verification"]["ok"]
    assert json.loads(json.dumps(report)) == report


def test_html_is_self_contained_with_charts_and_assumptions(make_ledger):
    path, _, _ = make_ledger(rounds=5)
    html = render_html(build_report(Ledger(path).releases, verification=verify_ledger(path)))
    assert html.startswith("<!DOCTYPE html>")
    assert html.count("<svg") == 2
    for title in ("Cumulative epsilon vs budget", "Clip norm per round"):
        assert title in html
    assert "Participation per round" not in html  # counts reveal participation
    assert "<polyline" in html and "stroke-dasharray" in html  # series and budget line
    assert "trusts" in html.lower() or "trusted" in html.lower()
    assert "Secure aggregation" in html and "What is not protected" in html
    assert "Cohort membership" in html and "Side channels" in html
    assert not re.search(r"https?://", html)
    assert "<script" not in html and "<link" not in html and "src=" not in html


def test_report_before_any_release_uses_the_config():
    cfg = DpConfig(
        mechanism="distributed_skellam",
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=0.1,
        rounds=10,
        delta=1e-6,
        budget_epsilon=4.0,
    )
    report = build_report([], config=cfg)
    assert report["epsilon"] == 0.0 and report["accountant"] == "skellam_rdp"
    html = render_html(report)
    assert "Distributed DP" in html and html.count("<svg") == 2
