"""`fedveil privacy audit` as the auditor uses it: canaries through the real engine, the
three epsilons, and an auditor with the power to refute a broken mechanism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedveil.config import load_config
from fedveil.simulations.audit import AuditMechanism, AuditRefused, plan_audit, run_audit

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast

# A wide linear model (tests/audit_task.py): 20,010 parameters, so 1,000 canary
# directions are nearly orthogonal. One round, every client in it (q = 1: no
# amplification, so z = 2.3 gives an accounted epsilon below 2 at delta = 1e-5).
DP_AUDIT = {
    "model.task": "audit_task:make",
    "data.num_clients": 10,
    "client.local_steps": 1,
    "server.rounds": 1,
    "server.sampling": "poisson",
    "server.sample_rate": 1.0,
    "dp.mechanism": "central",
    "dp.noise_multiplier": 2.3,
    "dp.epsilon": 2.0,
    "device": "cpu",
}


def config(tmp_path, **extra):
    return load_config(None, {**DP_AUDIT, "out": str(tmp_path / "run"), **extra})


@pytest.mark.slow
def test_noise_cut_4x_is_refuted_while_the_ledger_claims_the_configured_z(tmp_path):
    out = tmp_path / "audit"
    result = run_audit(
        config(tmp_path), canaries=1000, out=out, mechanism=AuditMechanism(noise_scale=0.25)
    )
    claimed = result["accounted_epsilon"]
    assert claimed <= 2.0  # the ledger still claims z = 2.3
    assert result["lower_bound_epsilon"] > claimed
    assert result["refuted"] and result["verdict"].startswith("REFUTED")
    on_disk = json.loads((out / "privacy" / "audit.json").read_text())
    assert on_disk["lower_bound_epsilon"] == result["lower_bound_epsilon"]
    ledger = [json.loads(line) for line in (out / "privacy" / "ledger.jsonl").open()]
    assert any(e.get("noise_multiplier") == 2.3 for e in ledger), "the claim is unchanged"


def test_an_honest_run_is_not_refuted_and_its_dir_is_marked_an_audit(tmp_path):
    out = tmp_path / "audit"
    result = run_audit(config(tmp_path), canaries=300, out=out)
    assert result["lower_bound_epsilon"] <= result["accounted_epsilon"]
    assert not result["refuted"]
    # The estimate's interval covers something near the claim, not 10x it.
    assert result["estimated_epsilon_interval"][0] < 2 * result["accounted_epsilon"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["audit"] is True
    assert not list(out.glob("model*")), "an audit's model is never written to be published"
    inserted = result["canaries_inserted"]
    assert 0 < inserted < 300 and result["canaries_held_out"] == 300 - inserted
    # Under DP a cohort's realised make-up is participation: the operator's private
    # files only; the public audit and report state the expected share.
    assert result["cohorts"] == [] and result["cohorts_private"] == "private/audit_cohorts.json"
    (cohort,) = json.loads((out / "private" / "audit_cohorts.json").read_text())
    assert cohort["users"] == 10 and cohort["canaries"] == inserted  # q = 1: all sampled
    assert result["canary_share_expected"] == pytest.approx(inserted / (10 + inserted))
    public = json.loads((out / "privacy" / "report.json").read_text())
    assert public["audit"]["cohorts"] == []
    assert '"canary_share":' not in (out / "privacy" / "audit.json").read_text()
    hist = result["histograms"]["projection_sum"]
    assert sum(hist["inserted"]) == inserted and sum(hist["held_out"]) == 300 - inserted


def test_a_fixed_size_cohort_run_is_audited_against_its_own_accountant(tmp_path):
    # The tutorials' runs draw fixed-size cohorts; auditing one stopped with "accountant=
    # 'pld' does not model sampling='fixed' ...; allowed: (..., 'pld')": PLD was chosen
    # from DP-FTRL's fixed-cohort rows, which do not make it compose sampled events.
    fixed = {"server.sampling": "fixed", "server.per_round": 10, "dp.epsilon": 8.0}
    result = run_audit(config(tmp_path, **fixed), canaries=300, out=tmp_path / "audit")
    assert result["fdp"]["accountant"] == "dpa_rdp"  # the ledger's own (replace-one)
    assert 0 < result["accounted_epsilon"] <= 8.0 and not result["refuted"]


def test_without_dp_there_is_no_claim_but_still_estimate_and_bound(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.rounds": 2,
            "device": "cpu",
            "out": str(tmp_path / "run"),
        },
    )
    result = run_audit(cfg, canaries=40, out=tmp_path / "audit")
    assert result["accounted_epsilon"] is None
    assert result["estimated_epsilon"] is not None and result["lower_bound_epsilon"] >= 0
    assert "no accounted epsilon" in result["verdict"] and not result["refuted"]
    # Fixed-size sampling: the cohort grows with the canaries, the users' rate stays 1/2.
    for cohort in result["cohorts"]:
        assert cohort["users"] + cohort["canaries"] == round(6 * (12 + cohort_total(result)) / 12)
    assert result["sampling_rate"] == pytest.approx(0.5, abs=0.02)


def cohort_total(result):
    return result["canaries_inserted"]


@pytest.mark.parametrize(
    ("extra", "canaries", "field"),
    [
        ({}, 0, "audit.canaries = 0"),
        ({"server.sample_rate": 0.05, "server.rounds": 3}, 100, "server.sample_rate"),
        ({"audit.target": "devices"}, 100, "audit.target = 'devices'"),
    ],
)
def test_an_audit_that_cannot_be_meaningful_is_refused_naming_the_field(
    tmp_path, extra, canaries, field
):
    with pytest.raises(AuditRefused, match=field.replace("(", r"\(")):
        run_audit(config(tmp_path, **extra), canaries=canaries, out=tmp_path / "audit")
    assert not (tmp_path / "audit" / "privacy" / "audit.json").exists()


def test_each_audit_draws_its_own_secret_canaries(tmp_path):
    cfg = config(tmp_path)
    a, b = (plan_audit(cfg, 10, 200, out=str(tmp_path / n)) for n in "ab")
    assert a.seed != b.seed and a.seed.bit_length() > 64  # from the OS CSPRNG
    assert not np.array_equal(a.inserted, b.inserted)
    assert str(a.seed) not in repr(a), "the seed stays out of reprs (and so of logs)"


def write_toml(path, values):
    from fedveil.config import to_toml

    path.write_text(to_toml(load_config(None, values)))
    return path


def test_cli_audit_of_a_run_without_dp_exits_0_and_writes_the_report(tmp_path, capsys):
    from fedveil.cli.main import main

    toml = write_toml(
        tmp_path / "run.toml",
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.rounds": 2,
            "device": "cpu",
            "out": str(tmp_path / "run"),
        },
    )
    code = main(["privacy", "audit", "--config", str(toml), "--canaries", "30"])
    out = capsys.readouterr().out
    assert code == 0
    assert "none: this run has no DP" in out
    assert "Steinke-Nasr-Jagielski lower bound (99%, delta term included)" in out
    audit_dir = tmp_path / "run-audit"  # the default: <out>-audit, never the run's own
    assert (audit_dir / "privacy" / "audit.json").exists()
    assert not (tmp_path / "run").exists()
    report = json.loads((audit_dir / "privacy" / "report.json").read_text())
    assert report["audit"]["accounted_epsilon"] is None
    html = (audit_dir / "privacy" / "report.html").read_text()
    assert "Canary audit: three epsilons" in html and html.count("<svg") == 1


def test_cli_audit_refutes_a_mechanism_without_noise_and_exits_1(tmp_path, capsys):
    import argparse

    from fedveil.cli.privacy import cmd_audit

    toml = write_toml(tmp_path / "run.toml", {**DP_AUDIT, "out": str(tmp_path / "run")})
    args = argparse.Namespace(config=str(toml), canaries=300, out=str(tmp_path / "audit"))
    # The harness's declared seam: the ledger claims z = 2.3, the releases carry no noise.
    code = cmd_audit(args, mechanism=AuditMechanism(noise_scale=0.0))
    captured = capsys.readouterr()
    assert code == 1
    assert "REFUTED at 99%" in captured.err and "150 of 150 guesses right" in captured.err
    assert "f-DP test of the claim (99%)" in captured.out and "ceiling:" in captured.out
    report = json.loads((tmp_path / "audit" / "privacy" / "report.json").read_text())
    assert report["audit"]["refuted"] is True
    assert report["audit"]["lower_bound_epsilon"] > report["audit"]["accounted_epsilon"]
    assert report["audit"]["estimated_epsilon"] > 10  # the estimate sees it too
    assert "budget_epsilon" in report, "joined to the audit run's own DP report"
    html = (tmp_path / "audit" / "privacy" / "report.html").read_text()
    assert "Lower bound (f-DP, 99%)" in html and 'class="bad"' in html


def test_more_canaries_than_the_model_can_keep_apart_are_refused(tmp_path, capsys):
    """Issue 28: 2,000 canaries on a 610-parameter logistic regression interfered and
    passed a mechanism with 1000x too little noise. A canary needs a coordinate of its
    own: the tiny task's 195 parameters support 195, and the refusal says so."""
    from fedveil.cli.main import main

    values = {
        "model.task": "tiny_task:make",
        "data.num_clients": 12,
        "server.per_round": 6,
        "server.rounds": 2,
        "device": "cpu",
        "out": str(tmp_path / "run"),
    }
    toml = write_toml(tmp_path / "run.toml", values)
    code = main(["privacy", "audit", "--config", str(toml), "--canaries", "196"])
    err = capsys.readouterr().err
    assert code == 2
    assert "audit.canaries = 196" in err and "supports at most 195 canaries" in err
    assert not (tmp_path / "run-audit" / "privacy" / "audit.json").exists()


def test_cli_refuses_zero_canaries_naming_the_field(tmp_path, capsys):
    from fedveil.cli.main import main

    toml = write_toml(tmp_path / "run.toml", {**DP_AUDIT, "out": str(tmp_path / "run")})
    code = main(["privacy", "audit", "--config", str(toml), "--canaries", "0"])
    assert code == 2
    assert "audit.canaries = 0" in capsys.readouterr().err


def test_canaries_take_part_in_secure_aggregation_like_users(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.rounds": 2,
            "device": "cpu",
            "secagg.enabled": True,
            "out": str(tmp_path / "run"),
        },
    )
    result = run_audit(cfg, canaries=40, out=tmp_path / "audit")
    metrics = [json.loads(line) for line in (tmp_path / "audit" / "metrics.jsonl").open()]
    for cohort, round_metrics in zip(result["cohorts"], metrics, strict=True):
        assert round_metrics["secagg_threat"] == "semi_honest"
        # Every canary went through the protocol's stages and its masked update was summed.
        assert round_metrics["dropped"] == 0
        assert round_metrics["cohort_aggregated"] == cohort["users"] + cohort["canaries"]
        assert cohort["canaries"] > 0


@pytest.mark.flower
@pytest.mark.slow
def test_an_audit_on_flower_sends_canaries_through_the_client_app(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.rounds": 2,
            "device": "cpu",
            "transport": "flower",
            "out": str(tmp_path / "run"),
        },
    )
    result = run_audit(cfg, canaries=20, out=tmp_path / "audit")
    metrics = [json.loads(line) for line in (tmp_path / "audit" / "metrics.jsonl").open()]
    assert len(result["cohorts"]) == len(metrics) == 2
    for cohort, round_metrics in zip(result["cohorts"], metrics, strict=True):
        assert round_metrics["dropped"] == 0  # the canaries answered through Flower
        assert round_metrics["cohort_aggregated"] == cohort["users"] + cohort["canaries"]
    assert json.loads((tmp_path / "audit" / "summary.json").read_text())["transport"] == "flower"


def test_cli_audit_of_distributed_dp_sums_every_sampled_canarys_noise_share(tmp_path, capsys):
    """Zero-out adjacency: a held-out canary is sampled like the others and takes part in
    secure aggregation with its update zeroed, so its Skellam share is in the sum."""
    from fedveil.cli.main import main

    values = {**DP_AUDIT, "dp.mechanism": "distributed", "secagg.enabled": True}
    toml = write_toml(tmp_path / "run.toml", {**values, "out": str(tmp_path / "run")})
    out = tmp_path / "audit"
    code = main(["privacy", "audit", "--config", str(toml), "--canaries", "120", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "privacy" / "audit.json").read_text())
    claimed = result["accounted_epsilon"]
    assert 0 < claimed <= 2.0 and result["estimated_epsilon"] is not None
    assert 0 <= result["lower_bound_epsilon"] <= claimed and not result["refuted"]
    assert result["held_out_canaries_take_part"] is True
    held_out = result["canaries_held_out"]
    assert 0 < held_out < 120 and result["canary_share_expected"] == pytest.approx(120 / 130)
    (cohort,) = json.loads((out / "private" / "audit_cohorts.json").read_text())
    assert cohort == {
        "round": 1,
        "users": 10,
        "canaries": 120,  # q = 1: every canary sampled, held out or not
        "canary_share": pytest.approx(120 / 130),
        "canaries_held_out": held_out,
    }
    # The coordinator unmasked one sum of every sampled client's masked input: the users',
    # the inserted canaries' and the held-out canaries' (their noise shares).
    annex = [json.loads(line) for line in (out / "private" / "rounds.jsonl").open()]
    (record,) = [r for r in annex if "cohort_aggregated" in r]
    assert record["dropped"] == 0 and record["cohort_aggregated"] == 130
    ledger = [json.loads(line) for line in (out / "privacy" / "ledger.jsonl").open()]
    assert any(e.get("mechanism") == "distributed_skellam" for e in ledger)


@pytest.mark.slow
def test_distributed_dp_without_client_noise_is_refuted_while_the_ledger_claims_z(tmp_path):
    # The auditor plays against clients that draw no Skellam noise (AuditMechanism's
    # distributed seam) while the ledger still claims z = 2.3: the held-out canaries'
    # zeroed updates make the two hypotheses differ by one canary, and the bound sees it.
    values = {**DP_AUDIT, "dp.mechanism": "distributed", "secagg.enabled": True}
    cfg = load_config(None, {**values, "out": str(tmp_path / "run")})
    out = tmp_path / "audit"
    result = run_audit(cfg, canaries=150, out=out, mechanism=AuditMechanism(noise_scale=0.0))
    assert result["accounted_epsilon"] <= 2.0
    assert result["lower_bound_epsilon"] > result["accounted_epsilon"] and result["refuted"]
    ledger = [json.loads(line) for line in (out / "privacy" / "ledger.jsonl").open()]
    assert any(e.get("noise_multiplier") == 2.3 for e in ledger), "the claim is unchanged"


@pytest.mark.flower
@pytest.mark.slow
def test_a_distributed_dp_audit_on_flower_sums_the_held_out_canaries_shares(tmp_path):
    cfg = load_config(
        None,
        {
            "model.task": "tiny_task:make",
            "data.num_clients": 12,
            "server.per_round": 6,
            "server.rounds": 2,
            "dp.mechanism": "distributed",
            "dp.noise_multiplier": 1.0,
            "dp.epsilon": 100.0,
            "secagg.enabled": True,
            "device": "cpu",
            "transport": "flower",
            "out": str(tmp_path / "run"),
        },
    )
    result = run_audit(cfg, canaries=20, out=tmp_path / "audit")
    assert result["held_out_canaries_take_part"] and result["lower_bound_epsilon"] >= 0
    cohorts = json.loads((tmp_path / "audit" / "private" / "audit_cohorts.json").read_text())
    annex = [json.loads(line) for line in (tmp_path / "audit" / "private" / "rounds.jsonl").open()]
    records = [r for r in annex if "cohort_aggregated" in r]
    assert len(cohorts) == len(records) == 2
    for cohort, record in zip(cohorts, records, strict=True):
        # Fixed-size cohorts grow with all 20 canaries: 6 * 32 / 12 = 16 clients a round,
        # each through Flower's ClientApp, held-out canaries' noise shares included.
        assert cohort["users"] + cohort["canaries"] == 16 == record["cohort_aggregated"]
        assert record["dropped"] == 0 and cohort["canaries_held_out"] <= cohort["canaries"]
    assert sum(c["canaries_held_out"] for c in cohorts) > 0


def test_the_verdict_says_when_the_canary_count_cannot_refute_the_claim():
    from fedveil.simulations.audit import verdict

    fdp = {
        "confidence": 0.99,
        "correct": 500,
        "guesses": 500,
        "p_value": 0.2,
        "ceiling_epsilon": 5.1,
        "canaries": 1000,
        "refuted": False,
        "lower_bound_epsilon": 5.1,
    }
    text = verdict(8.0, fdp, {"epsilon": 4.6})
    assert text.startswith("consistent at 99%")
    assert "cannot refute any epsilon above 5.1 with 1000 canaries" in text
    assert "so it cannot refute this claim (epsilon 8)" in text
    refuted = verdict(8.0, {**fdp, "ceiling_epsilon": 9.8, "refuted": True, "p_value": 0.002}, {})
    assert refuted.startswith("REFUTED at 99%") and "cannot refute this claim" not in refuted


# One audited DP run for the report checks below: 20 canaries, one round (cheap).
@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    base = tmp_path_factory.mktemp("audited")
    run_audit(config(base), canaries=20, out=base / "audit")
    return base / "audit"


def copy_of(run_dir, tmp_path):
    import shutil

    return Path(shutil.copytree(run_dir, tmp_path / "copy"))


def test_rewriting_an_audited_runs_report_keeps_its_audit(audited, tmp_path, capsys):
    """`fedveil privacy report` on an audit's directory rewrote report.json/html without
    the audit's section: the one report writer now joins privacy/audit.json itself."""
    from fedveil.cli.main import main

    run_dir = copy_of(audited, tmp_path)
    privacy = run_dir / "privacy"
    before_json, before_html = (
        (privacy / "report.json").read_text(),
        (privacy / "report.html").read_text(),
    )
    assert main(["privacy", "report", str(run_dir)]) == 0
    report = json.loads((privacy / "report.json").read_text())
    audit = json.loads((privacy / "audit.json").read_text())
    assert report["audit"]["lower_bound_epsilon"] == audit["lower_bound_epsilon"]
    assert report["audit"]["canaries"] == 20
    html = (privacy / "report.html").read_text()
    assert "Canary audit: three epsilons" in html
    # The audit command and `privacy report` are one path: the same bytes.
    assert (privacy / "report.json").read_text() == before_json
    assert html == before_html


def test_an_unreadable_audit_json_is_refused_naming_the_file(audited, tmp_path):
    from fedveil.server.engine.privacy_report import write_privacy_report

    run_dir = copy_of(audited, tmp_path)
    (run_dir / "privacy" / "audit.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"audit\.json: unreadable"):
        write_privacy_report(run_dir)


def test_verify_passes_on_an_audited_dir_and_fails_on_an_edited_epsilon(audited, tmp_path):
    from fedveil.server.engine.privacy_report import verify_run

    assert verify_run(audited).ok, verify_run(audited).message
    run_dir = copy_of(audited, tmp_path)
    path = run_dir / "privacy" / "report.json"
    report = json.loads(path.read_text())
    report["epsilon"] = report["epsilon"] / 2
    path.write_text(json.dumps(report, indent=2) + "\n")
    result = verify_run(run_dir)
    assert not result.ok and "report.json: epsilon" in result.message


def test_verify_fails_on_an_audit_section_that_is_not_audit_json(audited, tmp_path):
    """report.json's audit section (and the page drawn from it) must be audit.json's:
    a raised lower bound written into both files is caught."""
    from fedveil.server.engine.privacy_report import report_page, verify_run

    run_dir = copy_of(audited, tmp_path)
    privacy = run_dir / "privacy"
    report = json.loads((privacy / "report.json").read_text())
    report["audit"]["lower_bound_epsilon"] = 99.0
    (privacy / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (privacy / "report.html").write_text(report_page(report, privacy))
    result = verify_run(run_dir)
    assert not result.ok and "audit.lower_bound_epsilon" in result.message
