"""report.json: the run's privacy guarantee per adversary and its per-round series.

`epsilon` stays the observers' figure (what the published models reveal, amplified by
sampling while cohorts are secret); `adversaries` states one figure for each of the
observers, the coordinator and cohort members.

The public report is built from the public ledger alone: nothing in it may change with
who took part (docs/explanation/trust-model.md). The operator's report (`operator_report`) adds
what the private annex shows: each client's figure against the coordinator, their
distribution and the noise-only rounds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedveil.protocol.dp_rules import DP_FTRL

from .adversaries import (
    coordinator_bound_series,
    coordinator_figure,
    operator_coordinator_figure,
    realised_series,
)
from .assumptions import (
    assumptions_for,
    cohort_members_bound,
    cohort_members_text,
    neighbouring_protects,
    observers_holds_if,
    published_statistics,
    sampling_statement,
    sensitivity_statement,
)
from .config import DpConfig
from .ledger import CLOSE_KINDS, GENESIS_HASH, OPEN, RELEASE, entry_kind
from .participation import participation_section
from .verify import VerifyResult

REPORT_SCHEMA = "fedveil.dp.report/3"  # 3: the coordinator's public figure is a bound
# Why the public report neither marks noise-only rounds nor counts them (docs/explanation/
# trust-model.md): a round released as noise only is one in which no client's update survived.
# Whether anyone survived is a survivor count, and survivor counts reveal who took part,
# so under DP they live in the private annex; only the operator's report lists them.
NOISE_ONLY_WITHHELD = (
    "Rounds released as noise only (no client update survived; the model moved by noise "
    "alone) are marked only in the operator's report (private/report.html, or "
    "GET /runs/<id>/privacy/private with the admin token). Whether anyone survived a "
    "round reveals participation, so neither those rounds nor their number are published."
)
_SERIES_FIELDS = ("round", "epsilon", "clip_norm", "noise_multiplier")
_COORDINATOR_SERIES = "epsilon_coordinator_max"  # realised: the operator's report only
_BOUND_SERIES = "epsilon_coordinator_bound"  # a client in every round: public


def build_report(
    ledger_entries: Iterable[Mapping[str, Any]],
    *,
    config: DpConfig | None = None,
    verification: VerifyResult | None = None,
    secure_aggregation: str | None = None,
    cohort_source: str | None = None,
    budget_against: str | None = None,
) -> dict[str, Any]:
    """The public report of ledger entries (JSON-serialisable dict).

    `config` fills in the run's parameters when no round was released yet.
    `verification` (from verify_ledger) is embedded so a reader sees whether the
    numbers were recomputed independently, and gives the ledger's state.
    `secure_aggregation` ("off", "semi_honest", "malicious"), when known, says how
    updates travelled. `cohort_source` ("csprng" or "seed", from summary.json) says
    whether cohorts were secret. It takes no private annex: under distributed DP the
    coordinator's public figure is the bound for a client in every released round
    (`operator_report` adds each client's own). `budget_against` (dp.budget_against)
    is used when no release records it.
    """
    entries = [dict(entry) for entry in ledger_entries]
    releases = [entry for entry in entries if entry_kind(entry) == RELEASE]
    if not releases and config is None:
        raise ValueError("build_report needs at least one release entry or a config")
    last = releases[-1] if releases else _entry_from_config(config)  # type: ignore[arg-type]
    epsilon = float(last["epsilon"]) if releases else 0.0
    mechanism = str(last["mechanism"])
    delta = float(last["delta"])
    budget_against = str(last.get("budget_against", budget_against or "observers"))
    coordinator = coordinator_figure(mechanism, releases, delta)
    budgeted = epsilon
    if budget_against == "coordinator" and coordinator.get("epsilon_bound") is not None:
        budgeted = float(coordinator["epsilon_bound"])  # the operator's report: realised
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "epsilon": epsilon,
        "delta": delta,
        "budget_epsilon": last["budget_epsilon"],
        "budget_against": budget_against,
        "budget_remaining": max(0.0, float(last["budget_epsilon"]) - budgeted),
        **_parameters(last, cohort_source),
        "adversaries": _adversaries(last, epsilon, coordinator, cohort_source, secure_aggregation),
        "noise_only_rounds_statement": NOISE_ONLY_WITHHELD,
        "sensitivity": sensitivity_statement(mechanism, secure_aggregation),
        "published_statistics": _statistics(
            last, releases, config, secure_aggregation, coordinator, opening_record(entries)
        ),
        "ledger_state": ledger_state(entries, verification),
        "rounds": len(releases),
        "ledger_entries": len(entries),
        "ledger_head_hash": entries[-1]["hash"] if entries else GENESIS_HASH,
        "series": _series(releases, coordinator, delta),
        "assumptions": assumptions_for(
            mechanism,
            str(last["privacy_unit"]),
            str(last["neighbouring"]),
            str(last["sampling"]),
            epsilon,
            delta,
            secure_aggregation,
        ),
    }
    if last.get("max_participations") is not None:
        # Asynchronous DP: the cap-based bound, never how often anyone took part.
        report["participation"] = participation_section(last)
        report["sampling_statement"] = report["participation"]["statement"]
    opening = opening_record(entries)
    if opening is not None:
        # Ledger schema 3: the signed record devices pinned the ledger key from.
        report["ledger_opening"] = {
            "hash": opening["hash"],
            "key_id": opening.get("key_id"),
            "public_key": opening.get("public_key"),
            "plan": opening.get("plan"),
        }
    if secure_aggregation is not None:
        report["secure_aggregation"] = secure_aggregation
    if verification is not None:
        report["verification"] = _verification(verification)
    return report


def noise_only_rounds(private_records: Iterable[Mapping[str, Any]] | None) -> list[int]:
    """Rounds released with no client update in them (central DP: noise alone), from the
    operator's private annex (the engine marks them noise_only; older records: released
    with cohort_aggregated 0)."""
    rounds: set[int] = set()
    for record in private_records or ():
        number = record.get("round")
        if record.get("kind") == "charge" or not isinstance(number, int):
            continue
        released = record.get("applied") is True or record.get("status") == "applied"
        if record.get("noise_only") is True or (released and record.get("cohort_aggregated") == 0):
            rounds.add(number)
    return sorted(rounds)


def operator_report(
    report: Mapping[str, Any],
    private_records: Iterable[Mapping[str, Any]],
    ledger_entries: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The public report plus what only the operator may see, from the private annex:
    the noise-only rounds and, given the ledger's entries (the events each charge
    composes), each client's epsilon against the coordinator under distributed DP (the
    largest, the distribution, how many took part)."""
    records = [dict(record) for record in private_records]
    entries = [dict(entry) for entry in ledger_entries]
    releases = [entry for entry in entries if entry_kind(entry) == RELEASE]
    closing = entries[-1] if entries and entry_kind(entries[-1]) in CLOSE_KINDS else None
    public = report.get("adversaries", {}).get("coordinator", {})
    coordinator = operator_coordinator_figure(
        public, releases, closing, records, float(report["delta"])
    )
    full: dict[str, Any] = {
        **report,
        "view": "operator",
        "adversaries": {**report.get("adversaries", {}), "coordinator": coordinator},
        **_noise_only_view(noise_only_rounds(records), int(report.get("rounds", 0))),
    }
    maximum = coordinator.get("epsilon_max")
    if report.get("budget_against") == "coordinator" and maximum is not None:
        budget = float(report["budget_epsilon"])
        full["budget_remaining"] = max(0.0, budget - float(maximum))
    realised = realised_series(releases, records)  # schema-1 ledgers, else the annex
    if realised is not None:
        full["series"] = {**report["series"], _COORDINATOR_SERIES: realised}
    return full


def _noise_only_view(marked: list[int], released: int) -> dict[str, Any]:
    if marked:
        listed = ", ".join(str(r) for r in marked)
        statement = (
            f"{len(marked)} of {released} released rounds were noise only (no client update "
            f"survived; the model moved by noise alone): round{'s' if len(marked) > 1 else ''} "
            f"{listed}. Operator's view: this reveals participation; do not publish it."
        )
    else:
        statement = (
            f"None of the {released} released rounds was noise only: each carried at least "
            "one client's update. Operator's view: do not publish it."
        )
    return {"noise_only_rounds": marked, "noise_only_rounds_statement": statement}


def _parameters(last: Mapping[str, Any], cohort_source: str | None) -> dict[str, Any]:
    """The run's mechanism, z, sampling (with what q means in words) and adjacency."""
    sampling_rate = float(last["sampling_rate"])
    if last["mechanism"] == DP_FTRL:  # privacy from the participation schema, not sampling
        from .ftrl.ledger_fields import FTRL_FIELD, guarantee_statement

        record = last.get(FTRL_FIELD)
        return {
            "mechanism": DP_FTRL,
            "noise_multiplier": float(last["noise_multiplier"]),
            "sampling": last["sampling"],
            "sampling_rate": sampling_rate,
            "sampling_statement": guarantee_statement(record),
            "ftrl": record,
            "cohort_source": cohort_source,
            "privacy_unit": last["privacy_unit"],
            "neighbouring": last["neighbouring"],
            "neighbouring_protects": neighbouring_protects(
                str(last["neighbouring"]), str(last["privacy_unit"])
            ),
            "accountant": last["accountant"],
        }
    return {
        "mechanism": str(last["mechanism"]),
        "noise_multiplier": float(last["noise_multiplier"]),
        "sampling": last["sampling"],
        "sampling_rate": sampling_rate,
        "sampling_statement": sampling_statement(
            str(last["sampling"]), sampling_rate, cohort_source
        ),
        "cohort_source": cohort_source,
        "privacy_unit": last["privacy_unit"],
        "neighbouring": last["neighbouring"],
        "neighbouring_protects": neighbouring_protects(
            str(last["neighbouring"]), str(last["privacy_unit"])
        ),
        "accountant": last["accountant"],
    }


def _adversaries(
    last: Mapping[str, Any],
    epsilon: float,
    coordinator: dict[str, Any],
    cohort_source: str | None,
    secure_aggregation: str | None,
) -> dict[str, Any]:
    """One guarantee each for the observers, the coordinator and cohort members."""
    mechanism = str(last["mechanism"])
    sampling_rate = float(last["sampling_rate"])
    return {
        "observers": {
            "epsilon": epsilon,
            "delta": float(last["delta"]),
            "accountant": last["accountant"],
            "amplified_by_sampling": sampling_rate < 1.0,
            "holds_if": observers_holds_if(
                mechanism,
                sampling_rate,
                cohort_source,
                secure_aggregation,
                last.get("noise_shares"),
            ),
        },
        "coordinator": coordinator,
        "cohort_members": {
            "sees": cohort_members_text(secure_aggregation),
            "bound": cohort_members_bound(mechanism, secure_aggregation),
        },
    }


def _statistics(
    last: Mapping[str, Any],
    releases: list[dict[str, Any]],
    config: DpConfig | None,
    secure_aggregation: str | None,
    coordinator: Mapping[str, Any],
    opening: Mapping[str, Any] | None = None,
) -> list[dict[str, str]]:
    """What the run publishes and how each is protected."""
    return published_statistics(
        str(last["mechanism"]),
        str(last["neighbouring"]),
        secure_aggregation,
        adaptive_clipping=any("next_clip_norm" in entry for entry in releases)
        or bool(config is not None and config.adaptive_clipping),
        has_coordinator_epsilon=coordinator.get("epsilon_bound") is not None,
        has_cohort_commitment=bool(
            (releases and "cohort_commitment" in releases[0])
            or (opening is not None and "cohort_commitment" in opening)
        ),
    )


def opening_record(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ledger's opening record (schema 3), None when it has none."""
    return entries[0] if entries and entry_kind(entries[0]) == OPEN else None


def _series(
    releases: list[dict[str, Any]], coordinator: Mapping[str, Any], delta: float
) -> dict[str, list[Any]]:
    """Per-release values for the charts; under distributed DP the coordinator's bound
    (a client in every round so far), which the ledger's parameters alone give."""
    series = {name: [entry.get(name) for entry in releases] for name in _SERIES_FIELDS}
    if coordinator.get("epsilon_bound") is not None and releases:
        series[_BOUND_SERIES] = coordinator_bound_series(releases, delta)
    return series


def headline_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per adversary, z and q, and the ledger's state (for the CLI)."""
    if report.get("aggregation") == "allreduce":  # one ledger per silo, no coordinator
        return silo_report_lines(report) + attack_lines(report.get("attacks"))
    if "adversaries" not in report:  # a run without DP: a report of its attacks alone
        return attack_lines(report.get("attacks"))
    observers = report["adversaries"]["observers"]
    coordinator = report["adversaries"]["coordinator"]
    against = report.get("budget_against", "observers")
    lines = [
        f"observers: epsilon {float(observers['epsilon']):.4f} (delta {report['delta']:g})"
        + (f" of budget {report['budget_epsilon']:g}" if against == "observers" else "")
        + ("; holds while cohorts stay secret" if observers["amplified_by_sampling"] else ""),
    ]
    lines.extend(_coordinator_lines(coordinator, report))
    lines.append(f"z = {float(report['noise_multiplier']):.4g}; {report['sampling_statement']}")
    if "noise_only_rounds" in report:  # the operator's report only
        marked = ", ".join(str(r) for r in report["noise_only_rounds"]) or "none"
        lines.append(f"noise-only rounds (operator's view, do not publish): {marked}")
    if "participation" in report:
        cap = report["participation"]
        lines.append(
            f"asynchronous: each client in at most {cap['max_participations']} releases; "
            f"bound {float(cap['epsilon_cap_bound']):.4f} stated before the run"
        )
    lines.append(f"ledger: {report['ledger_state']}; {report['rounds']} releases")
    return lines + attack_lines(report.get("attacks"))


def _coordinator_lines(coordinator: Mapping[str, Any], report: Mapping[str, Any]) -> list[str]:
    """The public bound; in the operator's report also each client's realised figure."""
    if "epsilon_bound" not in coordinator:
        return [f"coordinator: {coordinator.get('statement', 'no figure')}"]
    budget = (
        f" of budget {report['budget_epsilon']:g}"
        if report.get("budget_against") == "coordinator"
        else ""
    )
    bound = coordinator["epsilon_bound"]
    if bound is None:
        text = f"no bound ({coordinator.get('bound_error', 'unknown')})"
    else:
        # Under a participation cap (asynchronous DP) the bound is for P releases.
        who = coordinator["bound"] if "participation" in report else "a client in every round"
        text = f"at most {float(bound):.4f} for any client ({who})"
    if report.get("view") != "operator":
        return [f"coordinator: {text}{budget}; each client's own figure: operator's report"]
    maximum, distribution = coordinator.get("epsilon_max"), coordinator.get("distribution")
    realised = "not recorded" if maximum is None else f"{float(maximum):.4f}"
    spread = (
        f", median {float(distribution['p50']):.4f}, p90 {float(distribution['p90']):.4f} "
        f"over {distribution['clients']} clients that took part"
        if distribution
        else ""
    )
    return [
        f"coordinator: {text}",
        f"coordinator (operator's view, do not publish): largest per-client epsilon "
        f"{realised}{budget}{spread}",
    ]


def ledger_state(entries: list[dict[str, Any]], verification: VerifyResult | None = None) -> str:
    """ "final", "interrupted at round N (resumable)", "failed: ...", or, unverified, what
    the last entry says."""
    found = _fields(verification)
    status = found.get("status")
    if status == "final":
        return "final"
    if status == "interrupted":
        return f"interrupted at round {found.get('training_round')} (resumable)"
    if verification is not None and not verification.ok:
        return f"failed: {verification.message}"
    if verification is not None and status is None:
        return "verified"  # a verifier without run states
    if not entries:
        return "empty: nothing released yet"
    last = entries[-1]
    kind = entry_kind(last)
    if kind == OPEN:
        return "opened: no release and no final or interruption record yet (still running)"
    if kind == RELEASE:
        return "open: no final or interruption record (still running, or truncated)"
    where = f" at round {last.get('training_round')}" if kind != "final" else ""
    return f"{kind}{where} (not verified)"


def _fields(verification: VerifyResult | None) -> dict[str, Any]:
    # The verifier grows fields over time: read the ones this version has.
    if verification is None or not dataclasses.is_dataclass(verification):
        return {}
    return dataclasses.asdict(verification)


def _verification(verification: VerifyResult) -> dict[str, Any]:
    found = _fields(verification)
    result = {
        "ok": verification.ok,
        "message": verification.message,
        "line": verification.line,
        "epsilon_recomputed": verification.epsilon_recomputed,
        "recomputed_epsilon": verification.final_epsilon,
    }
    for name in ("status", "training_round", "run_id", "key_id", "witnesses"):
        if name in found:
            result[name] = found[name]
    return result


def _entry_from_config(config: DpConfig) -> dict[str, Any]:
    return {
        "delta": config.delta,
        "budget_epsilon": config.budget_epsilon,
        "mechanism": config.mechanism,
        "noise_multiplier": config.noise_multiplier,
        "sampling": config.sampling,
        "sampling_rate": config.sampling_rate,
        "privacy_unit": config.privacy_unit,
        "neighbouring": config.neighbouring,
        "accountant": config.accountant_name,
        "max_participations": config.max_participations,
    }


# -- canary audits (`fedveil privacy audit`; the numbers from fedveil.privacy.audit) --

AUDIT_EXPLAINED = {
    "accounted": "An upper bound: what the accountant proves the mechanism delivers, if the "
    "code implements it as configured. No adversary can do better than this.",
    "estimated": "An estimate, not a bound (Andrew et al. 2024): how distinguishable the "
    "inserted canaries are from held-out ones in the released models, read as a Gaussian "
    "test. Near the accounted figure means the noise is doing its job; far above it means "
    "something leaks more than claimed.",
    "lower_bound": "A proven lower bound at 99% confidence from the one-run f-DP audit "
    "(Mahloujifar, Melis and Chaudhuri 2025): an adversary guessing which canaries were "
    "inserted did this well, which no mechanism with less leakage than this epsilon's "
    "(the run's own noise, scaled) allows. The test is against the accountant's own "
    "trade-off curve; if it refutes it, the running code does not deliver its claim. It "
    "can never exceed the ceiling the canary count reaches. The Steinke, Nasr and "
    "Jagielski bound (delta term included) is reported beside it as a second, "
    "conservative line.",
}


def audit_section(audit: Mapping[str, Any]) -> dict[str, Any]:
    """The audit's part of report.json: the three epsilons side by side, each explained,
    the verdict, each cohort's canary share, and the score histograms."""
    interval = audit.get("estimated_epsilon_interval")
    return {
        "accounted_epsilon": audit.get("accounted_epsilon"),
        "estimated_epsilon": audit.get("estimated_epsilon"),
        "estimated_epsilon_interval": interval,
        "lower_bound_epsilon": audit.get("lower_bound_epsilon"),
        "lower_bound_confidence": audit.get("lower_bound_confidence"),
        "ceiling_epsilon": audit.get("ceiling_epsilon"),
        "steinke_lower_bound_epsilon": (audit.get("steinke") or {}).get("epsilon"),
        "delta": audit.get("delta"),
        "explained": dict(AUDIT_EXPLAINED),
        "verdict": audit.get("verdict"),
        "refuted": bool(audit.get("refuted")),
        "canaries": audit.get("canaries"),
        "canaries_inserted": audit.get("canaries_inserted"),
        "canary_share_expected": audit.get("canary_share_expected"),
        "cohorts": list(audit.get("cohorts", [])),
        "histograms": dict(audit.get("histograms", {})),
    }


def audit_lines(audit: Mapping[str, Any]) -> list[str]:
    """The audit's findings for a terminal, in plain words."""
    accounted = audit.get("accounted_epsilon")
    estimate, interval = audit.get("estimated_epsilon"), audit.get("estimated_epsilon_interval")
    shares = [c["canary_share"] for c in audit.get("cohorts", [])]
    lines = [
        "accounted epsilon (upper bound): "
        + ("none: this run has no DP" if accounted is None else f"{accounted:.4g}"),
        "estimated epsilon (not a bound): "
        + (
            "n/a"
            if estimate is None
            else f"{estimate:.4g}"
            + ("" if not interval else f" (95% interval {interval[0]:.3g} to {interval[1]:.3g})")
        ),
        *_bound_lines(audit),
        f"canaries: {audit.get('canaries')} ({audit.get('canaries_inserted')} inserted; the "
        f"model supports up to {audit.get('canaries_supported')}); "
        + (
            f"canary share of cohorts {min(shares):.1%} to {max(shares):.1%}"
            if shares
            else f"expected canary share of each cohort {audit.get('canary_share_expected', 0):.1%}"
            " (under DP each cohort's realised share is in private/audit_cohorts.json)"
        ),
        str(audit.get("verdict", "")),
    ]
    return lines


def _bound_lines(audit: Mapping[str, Any]) -> list[str]:
    level = f"{float(audit.get('lower_bound_confidence') or 0.99):.0%}"
    steinke = audit.get("steinke") or {}
    lines = []
    fdp = audit.get("fdp")
    if fdp:
        lines.append(
            f"f-DP test of the claim ({level}): {fdp['correct']} of {fdp['guesses']} guesses "
            f"right, p <= {float(fdp['p_value']):.3g}; lower bound "
            f"{float(audit.get('lower_bound_epsilon') or 0.0):.4g}"
        )
        lines.append(
            f"ceiling: this audit cannot refute any epsilon above "
            f"{float(fdp['ceiling_epsilon']):.4g} with {fdp['canaries']} canaries"
        )
    lines.append(
        f"Steinke-Nasr-Jagielski lower bound ({level}, delta term included): "
        f"{float(steinke.get('epsilon', 0.0)):.4g}"
    )
    return lines


# -- attacks (`fedveil privacy attack ... --out <run>/privacy/attacks/<name>`) --------

ATTACKS_DIR = "attacks"  # under a run's privacy/: one folder per attack run
# Each attack's result file and the figures it names, relative to its folder.
ATTACK_FILES = ("attack.json", "membership.json", "model_inversion.json")
ATTACK_EXPLAINED = {
    "update_inversion": "Update inversion: an attacker who sees one client's update, the "
    "secure sum of a cohort's updates, or its DP-noised release reconstructs training "
    "images from it. Each grid shows true images (top) next to the reconstructions "
    "(bottom); PSNR and SSIM are against the best-matching true image.",
    "membership": "Membership inference on the final model: an attacker scores each "
    "candidate and guesses whether it took part in training. The ROC curve is the "
    "attacker's true against false positive rate; a DP run's curve must stay under the "
    "bound its epsilon implies, TPR <= e^eps * FPR + delta (dashed).",
    "model_inversion": "Model inversion: the input that maximises one class's confidence "
    "in the final model, one image per class. It shows what the model learnt of a class, "
    "not a particular person's record.",
}


def attacks_section(attacks_dir: Path) -> dict[str, Any] | None:
    """report.json's `attacks`: every attack result found under ATTACKS_DIR (one folder
    each), with its plain-words findings and its figures (paths relative to the privacy
    folder). None when there are none."""
    attacks_dir = Path(attacks_dir)
    found = []
    for folder in sorted(p for p in attacks_dir.glob("*") if p.is_dir()):
        for name in ATTACK_FILES:
            path = folder / name
            if not path.is_file():
                continue
            try:
                result = json.loads(path.read_text())
            except ValueError as error:
                raise ValueError(f"{path}: not JSON ({error})") from None
            found.append(_attack_entry(folder, name, result))
    if not found:
        return None
    return {"directory": ATTACKS_DIR, "explained": dict(ATTACK_EXPLAINED), "found": found}


def _attack_entry(folder: Path, name: str, result: Mapping[str, Any]) -> dict[str, Any]:
    rel = f"{ATTACKS_DIR}/{folder.name}"
    if name == "attack.json":
        kind = "update_inversion"
        figures = [f"{rel}/{o['grid']}" for o in result.get("observers", []) if o.get("grid")]
        statement = str(result.get("statement", ""))
    elif name == "membership.json":
        kind = "membership"
        image = result.get("roc_image")
        figures = [f"{rel}/{image}"] if image else []
        statement = membership_statement(result)
    else:
        kind = "model_inversion"
        figures = [f"{rel}/{result['image']}"] if result.get("image") else []
        statement = model_inversion_statement(result)
    figures = [f for f in figures if (folder.parent.parent / f).is_file()]
    return {
        "name": folder.name,
        "kind": kind,
        "file": f"{rel}/{name}",
        "figures": figures,
        "statement": statement,
    }


def membership_statement(result: Mapping[str, Any]) -> str:
    """What membership.json found, in plain words."""
    lines = []
    for run_name, run in result.get("runs", {}).items():
        what = "The non-private run" if run_name == "nondp" else "The DP run"
        if run.get("epsilon") is not None:
            what += f" (epsilon {float(run['epsilon']):.3g}, delta {run.get('delta'):.0e})"
        scores = ", ".join(
            f"{attack}: AUC {float(got['auc']):.2f}, TPR at 1% FPR "
            f"{float(got['tpr_at_1pct_fpr']):.2f}"
            for attack, got in run.get("attacks", {}).items()
        )
        lines.append(f"{what}: {scores} (AUC 0.5 is a coin flip).")
        bounds = [got["bound"] for got in run.get("attacks", {}).values() if "bound" in got]
        if bounds:
            significant = sum(int(b.get("significant_violations", 0)) for b in bounds)
            lines.append(
                "No ROC point lies significantly above the bound epsilon implies."
                if not significant
                else f"{significant} ROC point(s) lie above the bound epsilon implies at 95% "
                "confidence: the run leaks more than its DP claim allows."
            )
    return " ".join(lines)


def model_inversion_statement(result: Mapping[str, Any]) -> str:
    rows = result.get("classes", [])
    if not rows:
        return ""
    final = [float(r["final_confidence"]) for r in rows]
    low, high = f"{min(final):.0%}", f"{max(final):.0%}"
    # "100% to 100%" read as a typo: one figure when every class rounds to the same.
    spread = (
        f"{low} confidence in its class, for every class"
        if low == high
        else f"{low} to {high} confidence in its class"
    )
    return (
        f"One input per class ({len(rows)} classes) was optimised until the final model "
        f"gave it {spread}."
    )


def attack_lines(section: Mapping[str, Any] | None) -> list[str]:
    """The attacks' findings for a terminal, one line each."""
    if not section:
        return []
    return [f"attack {e['name']} ({e['kind']}): {e['statement']}" for e in section["found"]]


DP_SGD_ONLY_STATEMENT = (
    "DP-SGD only: no release is accounted here (no central or distributed DP); each "
    "device accounts its own example-level DP-SGD guarantee. This ledger opens with the "
    "run's plan and the key every device pinned, and closes with the run."
)


def ledger_only_report(
    ledger_entries: Iterable[Mapping[str, Any]], verification: VerifyResult | None = None
) -> dict[str, Any] | None:
    """The report of a ledger that opened a DP-SGD-only run (no release mechanism, no
    release), or None when the ledger is not one."""
    entries = [dict(entry) for entry in ledger_entries]
    opening = opening_record(entries)
    if opening is None or any(entry_kind(entry) == RELEASE for entry in entries):
        return None
    plan = opening.get("plan") or {}
    if plan.get("mechanism") != "none":
        return None
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "mechanism": "none",
        "dp_sgd": {"noise_multiplier": plan.get("dp_sgd_noise"), "clip": plan.get("dp_sgd_clip")},
        "statement": DP_SGD_ONLY_STATEMENT,
        "ledger_state": ledger_state(entries, verification),
        "rounds": 0,
        "ledger_entries": len(entries),
        "ledger_head_hash": entries[-1]["hash"],
        "ledger_opening": {
            "hash": opening["hash"],
            "key_id": opening.get("key_id"),
            "public_key": opening.get("public_key"),
            "plan": plan,
        },
    }
    if verification is not None:
        report["verification"] = _verification(verification)
    return report


# Fields of a silo's release entry the all-reduce report carries, round by round.
SILO_ROUND_FIELDS = (
    "round",
    "members",
    "attempt",
    "aborted_attempts",
    "mechanism",
    "noise_multiplier",
    "clip_norm",
    "epsilon",
    "sum_sha256",
)


def silo_run_report(
    silo_entries: Iterable[Mapping[str, Any]],
    verification: VerifyResult,
    silos: Iterable[int],
    trust_model: str | None,
) -> dict[str, Any]:
    """The report of a secure all-reduce run: one silo's ledger, which `verification`
    (every silo's ledger against its key, and their agreement) found equal to every
    other's. Figures come only from a verified account: when verification failed, the
    report says why and carries no epsilon."""
    entries = [dict(entry) for entry in silo_entries]
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "aggregation": "allreduce",
        "silos": sorted(silos),
        "trust_model": trust_model,
        "verification": _verification(verification),
        "epsilon": None,
        "rounds": [],
    }
    if not verification.ok:
        report["statement"] = f"not verified, so no figure is reported: {verification.message}"
        return report
    releases = [entry for entry in entries if entry_kind(entry) == RELEASE]
    final = entries[-1] if entries and entries[-1].get("kind") == "final" else None
    last = releases[-1] if releases else {}
    report.update(
        epsilon=final.get("epsilon") if final is not None else None,
        delta=last.get("delta"),
        budget_epsilon=last.get("budget_epsilon"),
        accountant=last.get("accountant"),
        privacy_unit=last.get("privacy_unit"),
        rounds=[{name: entry.get(name) for name in SILO_ROUND_FIELDS} for entry in releases],
        statement=(
            "epsilon against every silo and anyone who sees the released sums; each silo "
            "sees the others' updates only masked. " + (trust_model or "")
        ).strip(),
    )
    return report


def silo_report_lines(report: Mapping[str, Any]) -> list[str]:
    """The all-reduce report for a terminal."""
    silos = ", ".join(str(s) for s in report["silos"])
    lines = [f"secure all-reduce among silos {silos}: {report['verification']['message']}"]
    if report.get("epsilon") is None:
        lines.append(report.get("statement", "no figure"))
        return lines
    lines.append(
        f"epsilon {float(report['epsilon']):.4f} (delta {report['delta']:g}) of budget "
        f"{report['budget_epsilon']:g} after {len(report['rounds'])} releases"
    )
    if report.get("trust_model"):
        lines.append(f"trust model: {report['trust_model']}")
    return lines
