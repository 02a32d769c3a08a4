"""The privacy report states one figure per adversary (issue 16, "One epsilon per
adversary" and "Unaccounted releases"): observers of the published files get the
amplified epsilon, which holds only while cohorts are secret; the coordinator gets no
guarantee under central DP and each client's own unamplified epsilon under distributed
DP. Built from hand-made signed ledgers and private annexes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fedveil.privacy.dp import (
    DpConfig,
    Ledger,
    PrivacyBudget,
    build_report,
    render_html,
    verify_ledger,
)
from fedveil.privacy.dp.accounting import individual_epsilon
from fedveil.privacy.dp.report import operator_report
from fedveil.privacy.dp.signing import load_or_create_signer
from fedveil.server.engine.privacy_report import write_privacy_report

Q1_SENTENCE = "q = 1: no amplification by sampling; every round is charged in full"
ROUNDS = 6


def _ledger(
    path: Path,
    mechanism: str,
    *,
    sampling_rate: float = 0.1,
    close: str | None = "final",
    budget_against: str = "observers",
    neighbouring: str = "auto",
) -> tuple[DpConfig, list[float]]:
    """A signed ledger of ROUNDS releases; returns the config and, under distributed
    DP, the coordinator's bound recorded after each release (a client in every round)."""
    cfg = DpConfig(
        mechanism=mechanism,
        noise_multiplier=1.0,
        clip_norm=1.0,
        sampling_rate=sampling_rate,
        rounds=ROUNDS,
        delta=1e-5,
        budget_epsilon=100.0,
        population_size=100,
        cohort_size=max(1, round(100 * sampling_rate)),
        neighbouring=neighbouring,
    )
    ledger = Ledger(path, run_id="run-adv", signer=load_or_create_signer())
    budget = PrivacyBudget(cfg)
    maxima: list[float] = []
    for number in range(1, ROUNDS + 1):
        extra: dict[str, Any] = {"training_round": number, "budget_against": budget_against}
        if mechanism == "distributed_skellam":
            maxima.append(_unamplified(cfg, number))
            extra.update(noise_shares=7, epsilon_coordinator_bound=maxima[-1])
        budget.record_release(
            ledger, round_number=number, event=cfg.round_event(), clip_norm=1.0, extra=extra
        )
    fields: dict[str, Any] = {"training_round": ROUNDS, "epsilon": budget.spent()}
    if maxima:
        fields["epsilon_coordinator_bound"] = maxima[-1]
    if close:
        ledger.close(close, fields)
    return cfg, maxima


def _unamplified(cfg: DpConfig, participations: int) -> float:
    return individual_epsilon([cfg.round_event()] * participations, cfg.delta)


def _charges(participations: dict[int, int], cfg: DpConfig | None = None) -> list[dict[str, Any]]:
    """The operator's annex: per training round, who survived (and was charged), and with
    `cfg` the realised largest figure the engine records with each charge."""
    records: list[dict[str, Any]] = []
    busiest = max(participations.values())
    for number in range(1, ROUNDS + 1):
        survivors = sorted(c for c, n in participations.items() if n >= number)
        charge = {"round": number, "kind": "charge", "ledger_seq": number, "survivors": survivors}
        if cfg is not None:
            charge["epsilon_coordinator_max"] = _unamplified(cfg, min(number, busiest))
        records.append(charge)
        records.append({"round": number, "cohort": survivors, "cohort_aggregated": 3})
    return records


def _report(path: Path, **kwargs: Any) -> dict[str, Any]:
    return build_report(Ledger(path).entries, verification=verify_ledger(path), **kwargs)


def test_central_dp_names_the_coordinator_a_trusted_curator(tmp_path):
    path = tmp_path / "ledger.jsonl"
    _ledger(path, "central_gaussian")
    report = _report(path, secure_aggregation="semi_honest", cohort_source="csprng")
    observers = report["adversaries"]["observers"]
    assert observers["epsilon"] == report["epsilon"] == Ledger(path).releases[-1]["epsilon"]
    assert observers["amplified_by_sampling"] is True
    assert "cohorts stay secret (cohort_source csprng)" in observers["holds_if"]
    assert any("clients clip honestly" in item for item in observers["holds_if"])
    assert report["adversaries"]["coordinator"] == {
        "epsilon": None,
        "statement": "a trusted curator: it sees the un-noised sum; no guarantee holds against it",
    }
    assert "only its neighbours" in report["adversaries"]["cohort_members"]["sees"]
    assert "only for honest clients" in report["sensitivity"]
    assert report["cohort_source"] == "csprng" and report["budget_against"] == "observers"
    assert report["noise_multiplier"] == 1.0 and report["ledger_state"] == "final"
    assert Q1_SENTENCE not in report["sampling_statement"]


def test_distributed_dp_reports_each_clients_unamplified_epsilon(tmp_path):
    """A client in all 6 rounds: the coordinator knows it, so only its unamplified
    epsilon holds, far above the observers' amplified figure. The public report states
    that bound; each client's figure and their distribution are the operator's."""
    path = tmp_path / "ledger.jsonl"
    cfg, maxima = _ledger(path, "distributed_skellam")
    participations = {1: 5, 2: 3, **{client: 1 for client in range(3, 11)}}
    report = _report(path, secure_aggregation="malicious", cohort_source="csprng")
    coordinator = report["adversaries"]["coordinator"]
    assert coordinator["epsilon_bound"] == pytest.approx(_unamplified(cfg, 6))
    assert coordinator["epsilon_bound"] > report["epsilon"]  # amplification is gone
    assert "epsilon_max" not in coordinator and "distribution" not in coordinator
    assert "operator's report" in coordinator["per_client"]
    assert coordinator["accounting"] == (
        "individual, unamplified, from each client's own participations (Feldman & Zrnic 2021)"
    )
    assert report["series"]["epsilon_coordinator_bound"] == pytest.approx(maxima)
    assert "epsilon_coordinator_max" not in report["series"]
    assert "survivor set" in report["adversaries"]["cohort_members"]["sees"]
    assert report["neighbouring"] == "zero_out"
    assert "not the fact that it took part" in report["neighbouring_protects"]
    full = operator_report(report, _charges(participations, cfg), Ledger(path).entries)
    mine = full["adversaries"]["coordinator"]
    assert full["view"] == "operator"
    assert mine["epsilon_bound"] == coordinator["epsilon_bound"]
    assert mine["epsilon_max"] == pytest.approx(_unamplified(cfg, 5))  # nobody sat in all 6
    # The annex's recorded figure agrees; the public ledger records no realised figure.
    assert mine["recorded_epsilon_max"] == pytest.approx(_unamplified(cfg, 5))
    distribution = mine["distribution"]
    assert distribution["clients"] == 10
    assert distribution["max"] == mine["epsilon_max"]
    assert distribution["p50"] == pytest.approx(_unamplified(cfg, 1))
    assert distribution["p90"] == pytest.approx(_unamplified(cfg, 3))
    assert sum(row["clients"] for row in distribution["histogram"]) == 10
    realised = [_unamplified(cfg, min(n, 5)) for n in range(1, ROUNDS + 1)]
    assert full["series"]["epsilon_coordinator_max"] == pytest.approx(realised)
    assert not any("epsilon_coordinator_max" in e for e in Ledger(path).entries)
    text = json.dumps(full)
    assert '"survivors"' not in text and '"cohort_aggregated"' not in text  # no raw annex


def test_an_auditor_without_the_annex_gets_the_same_public_bound(tmp_path):
    path = tmp_path / "ledger.jsonl"
    cfg, _ = _ledger(path, "distributed_skellam")
    coordinator = _report(path, secure_aggregation="semi_honest")["adversaries"]["coordinator"]
    assert coordinator["epsilon_bound"] == pytest.approx(_unamplified(cfg, 6))
    assert "distribution" not in coordinator


def test_budget_against_the_coordinator_spends_the_coordinators_figure(tmp_path):
    path = tmp_path / "ledger.jsonl"
    cfg, _ = _ledger(path, "distributed_skellam", budget_against="coordinator")
    report = _report(path)
    assert report["budget_against"] == "coordinator"
    # Public: what a client in every round would have spent (no participation in it).
    assert report["budget_remaining"] == pytest.approx(100.0 - _unamplified(cfg, 6))
    # The operator's: what the busiest client actually spent.
    full = operator_report(report, _charges({1: 4, 2: 2}), Ledger(path).entries)
    assert full["budget_remaining"] == pytest.approx(100.0 - _unamplified(cfg, 4))


def test_the_public_report_is_the_same_whoever_took_part(tmp_path, capsys):
    """The observer holds report.json, report.html (also GET /runs/<id>/privacy) and
    what `fedveil privacy report` prints. Two runs with the same public ledger but
    different participation in the operator's annex must look the same to it, byte for
    byte; only the operator's reports may differ."""
    from fedveil.cli.main import main

    run = tmp_path / "run"
    (run / "privacy").mkdir(parents=True)
    _ledger(run / "privacy" / "ledger.jsonl", "distributed_skellam")
    (run / "config.toml").write_text('[secagg]\nenabled = true\nthreat = "malicious"\n')
    (run / "private").mkdir(mode=0o700)
    annex = run / "private" / "rounds.jsonl"
    seen: dict[str, dict[str, bytes]] = {}
    for name, participations in {
        "few, often": {1: 6, 2: 6, 3: 5},
        "many, rarely": {client: 1 + client % 2 for client in range(1, 41)},
    }.items():
        annex.write_text("".join(json.dumps(r) + "\n" for r in _charges(participations)))
        code = main(["privacy", "report", str(run)])  # hand-made: no Skellam params, 1
        seen[name] = {
            "cli": f"{code}\n{capsys.readouterr().out}".encode(),
            **{
                f"{folder}/{file}": (run / folder / file).read_bytes()
                for folder in ("privacy", "private")
                for file in ("report.json", "report.html")
            },
        }
    first, second = seen.values()
    for public in ("cli", "privacy/report.json", "privacy/report.html"):
        assert first[public] == second[public], public
    for private in ("private/report.json", "private/report.html"):
        assert first[private] != second[private], private
    assert b"40 clients that took part" in second["private/report.html"]
    assert b"40 clients" not in second["privacy/report.html"]


def test_seeded_cohorts_say_q_is_one_and_why(tmp_path):
    path = tmp_path / "ledger.jsonl"
    _ledger(path, "central_gaussian", sampling_rate=1.0)
    report = _report(path, secure_aggregation="off", cohort_source="seed")
    assert report["sampling_statement"].startswith(Q1_SENTENCE)
    assert "public run seed" in report["sampling_statement"]
    observers = report["adversaries"]["observers"]
    assert observers["amplified_by_sampling"] is False
    assert not any("cohorts stay secret" in item for item in observers["holds_if"])
    assert "re-clips" in report["sensitivity"]
    trust = report["assumptions"]["trust"]
    assert not any(item.startswith("Clients are trusted to clip") for item in trust)
    assert Q1_SENTENCE in render_html(report)


def test_published_statistics_say_how_each_is_protected(tmp_path):
    path = tmp_path / "ledger.jsonl"
    _ledger(path, "central_gaussian", neighbouring="add_remove")
    stats = {
        s["name"]: s["protection"]
        for s in _report(path, secure_aggregation="semi_honest")["published_statistics"]
    }
    assert stats["model (one per round)"].startswith("accounted release")
    assert "not client data" in stats["test_loss, test_accuracy"]
    assert "public parameters" in stats["epsilon series (ledger, metrics, report)"]
    assert stats["round status (applied / aborted)"].startswith("reveals participation")
    private = next(name for name in stats if name.startswith("cohort and survivor counts"))
    assert "drop reasons" in private and "federated evaluation" in private
    assert stats[private].startswith("private annex only")
    zero_out = tmp_path / "zero_out.jsonl"
    _ledger(zero_out, "central_gaussian", neighbouring="zero_out")
    stats = {
        s["name"]: s["protection"]
        for s in _report(zero_out, secure_aggregation="semi_honest")["published_statistics"]
    }
    assert stats["round status (applied / aborted)"].startswith("no participation signal")


def test_under_distributed_dp_federated_evaluation_is_refused_not_kept_private(tmp_path):
    # The coordinator, against whom distributed DP's epsilon is stated, would read each
    # client's accuracy and loss: the report says it is refused, not "private annex".
    path = tmp_path / "ledger.jsonl"
    _ledger(path, "distributed_skellam")
    report = _report(path, secure_aggregation="semi_honest")
    stats = {s["name"]: s["protection"] for s in report["published_statistics"]}
    assert stats["federated evaluation"].startswith("refused under distributed DP")
    assert "in the clear" in stats["federated evaluation"]
    annexed = next(name for name in stats if name.startswith("cohort and survivor counts"))
    assert "federated evaluation" not in annexed
    observers = report["assumptions"]["who_sees_what"][-1]
    assert "Federated evaluation is refused under distributed DP" in observers
    assert "federated evaluation stay in" not in observers
    html = render_html(report)
    assert "refused under distributed DP" in html
    central = tmp_path / "central.jsonl"
    _ledger(central, "central_gaussian")
    text = _report(central, secure_aggregation="semi_honest")["assumptions"]["who_sees_what"]
    assert "federated evaluation stay in the operator's private annex" in text[-1]


def test_an_interrupted_ledger_says_where_it_stopped(tmp_path):
    path = tmp_path / "ledger.jsonl"
    _ledger(path, "central_gaussian", close="interrupted")
    report = _report(path)
    assert report["ledger_state"] == f"interrupted at round {ROUNDS} (resumable)"
    assert "interrupted at round" in render_html(report)
    open_path = tmp_path / "open.jsonl"
    _ledger(open_path, "central_gaussian", close=None)
    assert _report(open_path)["ledger_state"].startswith("failed")


def test_an_old_ledger_with_cohort_counts_still_renders():
    entry = {
        "round": 1,
        "mechanism": "central_gaussian",
        "noise_multiplier": 1.1,
        "clip_norm": 0.5,
        "sampling_rate": 0.05,
        "sampling": "poisson",
        "neighbouring": "add_remove",
        "privacy_unit": "user",
        "cohort_planned": 5,
        "cohort_aggregated": 4,
        "delta": 1e-5,
        "epsilon": 0.3,
        "accountant": "rdp",
        "budget_epsilon": 8.0,
        "hash": "ab" * 32,
    }
    report = build_report([entry, {**entry, "round": 2, "epsilon": 0.4}])
    assert "cohort_planned" not in report["series"] and report["series"]["round"] == [1, 2]
    assert report["epsilon"] == 0.4 and report["cohort_source"] is None
    assert "the report does not know how they were drawn" in report["sampling_statement"]
    html = render_html(report)
    assert html.count("<svg") == 2 and "Participation" not in html


def test_write_privacy_report_reads_the_run_and_keeps_the_page_self_contained(tmp_path):
    run = tmp_path / "run"
    (run / "privacy").mkdir(parents=True)
    _, maxima = _ledger(run / "privacy" / "ledger.jsonl", "distributed_skellam")
    (run / "config.toml").write_text(
        '[secagg]\nenabled = true\nthreat = "malicious"\n[dp]\nseeded_cohorts = false\n'
    )
    (run / "summary.json").write_text(json.dumps({"cohort_source": "csprng"}))
    (run / "private").mkdir(mode=0o700)
    annex = run / "private" / "rounds.jsonl"
    annex.write_text("".join(json.dumps(r) + "\n" for r in _charges({7: 6, 8: 2})))
    report = write_privacy_report(run)
    assert report["cohort_source"] == "csprng" and report["secure_aggregation"] == "malicious"
    assert "distribution" not in report["adversaries"]["coordinator"]
    assert json.loads((run / "privacy" / "report.json").read_text()) == report
    operator = json.loads((run / "private" / "report.json").read_text())
    assert operator["adversaries"]["coordinator"]["distribution"]["clients"] == 2
    html = (run / "privacy" / "report.html").read_text()
    for text in (
        "Observers of what is published",
        "The coordinator",
        "Cohort members",
        "z = 1",
        "Published statistics",
        "Ledger state",
        "for any client (a client in every released round)",
    ):
        assert text in html, text
    assert "largest per-client" in (run / "private" / "report.html").read_text()
    assert not re.search(r"https?://", html)
    assert "<script" not in html and "<link" not in html and "src=" not in html
    annex.unlink()  # an auditor's copy: the annex is not there; the same public report
    assert write_privacy_report(run) == report
    assert report["adversaries"]["coordinator"]["epsilon_bound"] == pytest.approx(maxima[-1])


def test_the_cli_prints_one_figure_per_adversary(tmp_path, capsys):
    from fedveil.cli.main import main

    run = tmp_path / "run"
    (run / "privacy").mkdir(parents=True)
    _ledger(run / "privacy" / "ledger.jsonl", "central_gaussian", sampling_rate=1.0)
    (run / "config.toml").write_text("[secagg]\nenabled = false\n[dp]\nseeded_cohorts = true\n")
    assert main(["privacy", "report", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("observers: epsilon ")
    assert "coordinator: a trusted curator" in out
    assert Q1_SENTENCE in out and "public run seed" in out
    assert "ledger: final; 6 releases" in out
