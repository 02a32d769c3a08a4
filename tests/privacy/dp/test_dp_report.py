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
    assert report["epsilon"] == 0.0 and report["accountant"] == "skellam_rdp_integer"
    html = render_html(report)
    assert "Distributed DP" in html and html.count("<svg") == 2


def test_z_and_q_equal_to_one_are_said_in_words_in_html_and_text():
    from fedveil.privacy.dp.report import headline_lines

    cfg = DpConfig(
        mechanism="central_gaussian",
        noise_multiplier=1.34,
        clip_norm=1.0,
        sampling_rate=1.0,
        sampling="fixed",
        rounds=5,
        delta=1e-5,
        budget_epsilon=8.0,
        cohort_size=3,
        population_size=3,
    )
    report = build_report([], config=cfg, cohort_source="seed")
    html = render_html(report)
    assert "z = 1.34</b>" in html
    words = "q = 1: no amplification by sampling; every round is charged in full."
    assert words in html and "public run seed" in html
    text = "\n".join(headline_lines(report))
    assert "z = 1.34" in text and words in text


# The operator's private annex: round 2 released with nobody in it, round 4 marked by the
# engine, round 3 aborted (nothing released), and a charge record that is no round.
ANNEX = [
    {"round": 1, "status": "applied", "applied": True, "cohort_aggregated": 3},
    {"round": 2, "status": "applied", "applied": True, "cohort_aggregated": 0},
    {"kind": "charge", "round": 2, "clients": [1, 2]},
    {"round": 3, "status": "aborted", "applied": False, "cohort_aggregated": 0},
    {"round": 4, "status": "applied", "applied": True, "cohort_aggregated": 0, "noise_only": True},
    {"round": 5, "status": "applied", "applied": True, "cohort_aggregated": 2},
]


def test_noise_only_rounds_are_marked_in_the_operators_report_only(make_ledger):
    from fedveil.privacy.dp.report import headline_lines, noise_only_rounds, operator_report

    path, _, _ = make_ledger(rounds=5)
    public = build_report(Ledger(path).entries, verification=verify_ledger(path))
    assert noise_only_rounds(ANNEX) == [2, 4]
    # Public: not the rounds, not their number (survivor counts reveal participation).
    assert "noise_only_rounds" not in public
    assert "neither those rounds nor their number" in public["noise_only_rounds_statement"]
    html = render_html(public)
    assert "<b>Noise-only rounds.</b> Rounds released as noise only" in html
    assert "noise-only round<" not in html and "Operator&#x27;s view" not in html
    assert not any("noise-only" in line for line in headline_lines(public))

    private = operator_report(public, ANNEX)
    assert private["noise_only_rounds"] == [2, 4] and private["view"] == "operator"
    assert private["noise_only_rounds_statement"].startswith(
        "2 of 5 released rounds were noise only"
    )
    html = render_html(private)
    assert "<b>Operator's view.</b>" in html
    assert '<p class="bad"><b>Noise-only rounds.</b> 2 of 5 released rounds' in html
    assert "rounds 2, 4." in html
    assert ">noise-only round</text>" in html  # the epsilon chart marks them
    assert html.count('r="6" fill="none" stroke="#d97706"') == 2  # a ring per noise-only round
    assert "noise-only rounds (operator's view, do not publish): 2, 4" in headline_lines(private)
    none = operator_report(public, ANNEX[:1])
    assert none["noise_only_rounds"] == []
    assert none["noise_only_rounds_statement"].startswith("None of the 5 released rounds")


def test_model_inversion_statement_gives_one_figure_when_every_class_rounds_the_same():
    from fedveil.privacy.dp.report import model_inversion_statement

    same = {"classes": [{"final_confidence": 0.9996}, {"final_confidence": 1.0}]}
    text = model_inversion_statement(same)
    # It read "gave it 100% to 100% confidence in its class".
    assert "100% to 100%" not in text
    assert "gave it 100% confidence in its class, for every class." in text
    spread = {"classes": [{"final_confidence": 0.5}, {"final_confidence": 0.97}]}
    assert "gave it 50% to 97% confidence in its class." in model_inversion_statement(spread)


def test_a_dp_ftrl_report_claims_nothing_about_sampling_amplification():
    from fedveil.privacy.dp.assumptions import assumptions_for

    ftrl = assumptions_for("dp_ftrl", "user", "zero_out", "fixed", 9.9, 1e-5, "off")
    central = assumptions_for("central_gaussian", "user", "replace_one", "fixed", 8, 1e-5, "off")
    said = " ".join(ftrl["not_protected"] + ftrl["trust"])
    # DP-FTRL's epsilon has no amplification in it: an auditor reading that it rests on
    # secret sampling would misjudge what protects the clients.
    assert "amplification assumes" not in said and "amplified" not in said
    assert any("amplification assumes" in item for item in central["not_protected"])
    # In the clear the server re-clips every update itself, as under central DP.
    assert not any(item.startswith("Clients are trusted to clip") for item in ftrl["trust"])
    assert any("re-clips every update" in item for item in ftrl["trust"])
