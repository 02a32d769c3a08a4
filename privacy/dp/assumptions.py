"""The trust model in plain words: who sees what under each mode, which epsilon holds
against whom and under which assumptions, and how each published statistic is protected.

Everything here is text for the report (report.json, report.html) and the docs; the
figures come from report.py and adversaries.py.
"""

from __future__ import annotations

from fedveil.protocol.dp_rules import (
    ADD_REMOVE,
    CENTRAL_GAUSSIAN,
    DISTRIBUTED_SKELLAM,
    DP_FTRL,
    DP_SGD,
    REPLACE_ONE,
    ZERO_OUT,
)

OFF, SEMI_HONEST, MALICIOUS = "off", "semi_honest", "malicious"

_TRUST = {
    CENTRAL_GAUSSIAN: [
        "Central DP: the server is trusted to add Gaussian noise of standard deviation "
        "z x C to the aggregated sum and to never publish, log or reuse the sum before "
        "the noise is added.",
        "Secure aggregation, if enabled, hides each client's update from the server but "
        "not their sum: the server still sees the un-noised sum.",
        "Clients are trusted to clip their update to the L2 norm C: under secure "
        "aggregation the server cannot check it.",
    ],
    DISTRIBUTED_SKELLAM: [
        "Distributed DP: every client adds its own Skellam noise share before secure "
        "aggregation masks its update, so the server only ever sees an already-noised "
        "sum. The guarantee holds even against the server, given honest clients.",
        "It assumes enough honest clients: nothing is unmasked unless the survivors, minus "
        "the clients that secagg.adversarial_rate allows to be corrupt, still carry the "
        "calibrated number of noise shares; clients colluding with the server can subtract "
        "their own shares.",
        "secagg.adversarial_rate is an assumption about enrolment, which no protocol "
        "checks: the operator enrols the devices, so an operator who is also the "
        "coordinator can fill a cohort with devices it controls. The epsilon stated "
        "against the coordinator holds only while at most that fraction of every cohort "
        "is the coordinator's; if every other member is, a client is protected by its own "
        "noise share alone (z / sqrt(min_honest) per release), a larger epsilon that each "
        "device computes, logs and may cap (fedveil client --max-own-share-epsilon).",
        "Clients are trusted to clip, round and add their noise share as specified; the "
        "secure aggregation protocol is trusted to reveal only the modular sum.",
    ],
    DP_FTRL: [
        "DP-FTRL: the server is trusted to add noise correlated across rounds, as the "
        "recorded factorisation prescribes, to each round's aggregated sum, to keep its "
        "noise state secret, and to never publish, log or reuse a sum before its noise is "
        "added.",
        "The epsilon holds for clients that kept to the participation schema: the server's "
        "cohort sampler enforces it, and devices refuse participations beyond their own "
        "count; no amplification by sampling is claimed.",
        "Clients are trusted to clip their update to the L2 norm C: under secure "
        "aggregation the server cannot check it.",
    ],
    DP_SGD: [
        "Sample-level DP: each client runs DP-SGD (per-example clipping and Gaussian "
        "noise) locally; the guarantee is per client, for each of its examples.",
        "Nobody else needs to be trusted for this guarantee, but it protects examples, "
        "not users: a user contributing k examples is protected only through group "
        "privacy (roughly k times the epsilon).",
    ],
}

# How the run's updates travelled: None when the report does not know (a bare ledger).
_SECURE_AGGREGATION = {
    OFF: "Secure aggregation was off in this run: the server saw each client's clipped "
    "update in the clear.",
    SEMI_HONEST: "Secure aggregation ran in semi-honest mode: individual updates are "
    "hidden from a server that follows the protocol; a server that deviates from it "
    "(substitutes clients' keys, shows different clients different survivor sets) is "
    "not guarded against, and the clients' own survivor check assumes the server shows "
    "every client the same survivor set.",
    MALICIOUS: "Secure aggregation ran in malicious-server mode: clients checked each "
    "other's signed keys against the operator's roster and co-signed the survivor set "
    "before unmasking, so even a server that deviates learns only sums over at least the "
    "threshold of clients, provided the roster reached the clients by a channel the server "
    "does not control.",
}

# What a cohort member learns of the cohort, by secure-aggregation mode.
_COHORT_MEMBERS = {
    OFF: "Without secure aggregation a client talks only to the server: it learns nothing "
    "of who else is in its cohort beyond what the published model shows.",
    SEMI_HONEST: "Semi-honest secure aggregation: a client learns only its neighbours in the "
    "masking graph, not the whole cohort (assuming a server that follows the protocol).",
    MALICIOUS: "Malicious-server secure aggregation: every client sees the signed survivor "
    "set of its round (the consistency round needs it), so cohort members learn who "
    "else's update entered the sum.",
}

_AMPLIFICATION = (
    "Sampling amplification assumes the sampling really is as declared and that the "
    "adversary does not learn who was sampled."
)

_NOT_PROTECTED = [
    "Cohort membership against the coordinator, which draws every cohort, and against "
    "cohort members, who learn part of their own cohorts: the observers' amplified "
    "epsilon does not hold against them (see the coordinator's figure).",
    "Side channels: timing, message sizes, device behaviour, network identifiers, "
    "floating-point artefacts of the noise sampler.",
    "Colluding clients beyond the secure-aggregation threshold, or a server that "
    "deviates from the protocol where it is trusted (see above).",
    "Anything released outside this ledger and the statistics listed above: hyperparameter "
    "searches over repeated runs, or files the operator copies out of private/.",
    _AMPLIFICATION,
]

_FTRL_COHORTS = (
    "Cohort membership against the coordinator, which draws every cohort, and against "
    "cohort members, who learn part of their own cohorts. DP-FTRL's epsilon claims no "
    "amplification by sampling, so it does not rest on cohorts being secret; whether a "
    "client took part is protected only as far as the neighbouring relation says."
)


def who_sees_what(mechanism: str, secure_aggregation: str | None) -> list[str]:
    """Who sees what in this run's mode: the coordinator, cohort members, observers."""
    if mechanism == DISTRIBUTED_SKELLAM:
        coordinator = (
            "The coordinator draws every cohort and sees each round's sum only after the "
            "honest clients' noise shares are in it (never an individual update)."
        )
    elif secure_aggregation == OFF:
        coordinator = (
            "The coordinator draws every cohort and sees each client's clipped update and "
            "the un-noised sum."
        )
    elif secure_aggregation in (SEMI_HONEST, MALICIOUS):
        coordinator = (
            "The coordinator draws every cohort and sees the un-noised sum (secure "
            "aggregation hides the individual updates, not their sum)."
        )
    else:
        coordinator = "The coordinator draws every cohort and sees the un-noised sum."
    if mechanism == DISTRIBUTED_SKELLAM:
        annex = (
            "cohorts, counts, drop reasons and client losses stay in the operator's private "
            "annex. Federated evaluation is refused under distributed DP (by the config and "
            "by the devices): the coordinator would see each client's accuracy and loss in "
            "the clear."
        )
    else:
        annex = (
            "cohorts, counts, drop reasons, client losses and federated evaluation stay in "
            "the operator's private annex."
        )
    return [
        coordinator,
        cohort_members_text(secure_aggregation),
        "Observers of what is published see the released models and the public run files "
        f"(ledger, metrics without counts, report); {annex}",
    ]


def secure_aggregation_text(secure_aggregation: str | None) -> str | None:
    return _SECURE_AGGREGATION.get(secure_aggregation or "")


def cohort_members_text(secure_aggregation: str | None) -> str:
    return _COHORT_MEMBERS.get(
        secure_aggregation or "",
        "Unknown how updates travelled (no run config): what cohort members learn of the "
        "cohort depends on the secure-aggregation mode.",
    )


def cohort_members_bound(mechanism: str, secure_aggregation: str | None) -> str:
    """Which figure holds against a cohort member."""
    if mechanism == DISTRIBUTED_SKELLAM:
        return (
            "at most the coordinator's figure for that client, since a cohort member knows "
            "no more of the cohorts than the coordinator and sees no sum it does not"
        )
    if secure_aggregation == OFF:
        return (
            "the observers' epsilon, since a cohort member sees only the published models "
            "and learns nothing of who else was in its cohort"
        )
    return (
        "the observers' epsilon for clients it does not know were in its rounds; for those "
        "it learns were (its neighbours, or the survivor set in malicious mode) only an "
        "unamplified figure holds, which this report does not compute under central DP"
    )


def neighbouring_protects(neighbouring: str, privacy_unit: str) -> str:
    """What the adjacency hides, in one sentence."""
    unit = privacy_unit
    if neighbouring == ZERO_OUT:
        return (
            f"zero-out: hides the content of a {unit}'s data, not the fact that it took "
            "part (neighbouring runs differ by that one's update being replaced by zero)."
        )
    if neighbouring == ADD_REMOVE:
        return (
            f"add/remove: hides whether a {unit} took part at all, and so also what its data was."
        )
    if neighbouring == REPLACE_ONE:
        return (
            f"replace-one: hides the content of a {unit}'s data given a fixed cohort size "
            "(neighbouring runs differ by one member's data being swapped for another's)."
        )
    return f"{neighbouring}: an adjacency this report has no description for."


def sampling_statement(sampling: str, sampling_rate: float, cohort_source: str | None) -> str:
    """Whether the observers' epsilon is amplified by sampling, and why (not)."""
    if sampling_rate >= 1.0:
        why = ""
        if cohort_source == "seed":
            why = (
                " Cohorts were drawn from the public run seed (dp.seeded_cohorts = true): "
                "anyone holding the run files recomputes them, so the run is accounted "
                "without amplification."
            )
        return "q = 1: no amplification by sampling; every round is charged in full." + why
    source = {
        "csprng": "they were drawn from a secret key (cohort_source csprng)",
        "seed": "WARNING: they were drawn from the public run seed (cohort_source seed), so "
        "this amplification does not hold against anyone holding the run files",
    }.get(cohort_source or "", "the report does not know how they were drawn")
    return (
        f"q = {sampling_rate:.4g} ({sampling} sampling): epsilon is amplified by sampling, "
        f"which holds only while cohorts stay secret; {source}."
    )


def observers_holds_if(
    mechanism: str,
    sampling_rate: float,
    cohort_source: str | None,
    secure_aggregation: str | None,
    noise_shares: int | None,
) -> list[str]:
    """The assumptions under which the observers' (published) epsilon holds."""
    holds: list[str] = []
    if sampling_rate < 1.0:
        holds.append("cohorts stay secret (cohort_source csprng)")
        if cohort_source != "csprng":
            holds.append(
                f"(cohort_source is {cohort_source or 'unknown'}: this assumption is "
                "not met, or not known to be met)"
            )
    holds.append(
        "observers see only what is published: the released models and the public run "
        "files (the operator's private annex, private/, stays private)"
    )
    if mechanism == DP_FTRL:
        holds.append(
            "no client took part more often or closer together than the participation "
            "schema allows, and the server's noise state stays secret"
        )
    if mechanism in (CENTRAL_GAUSSIAN, DP_FTRL):
        holds.append(
            "the coordinator adds the noise before anything derived from the sum leaves it"
        )
        if secure_aggregation in (SEMI_HONEST, MALICIOUS):
            holds.append(
                "clients clip honestly: under secure aggregation the server cannot check the "
                "clip, so the sensitivity holds only for honest clients"
            )
    elif mechanism == DISTRIBUTED_SKELLAM:
        if noise_shares == 1:
            shares = "1 honest client's noise share"
        elif noise_shares:
            shares = f"{noise_shares} honest clients' noise shares"
        else:
            shares = "the calibrated number of honest clients' noise shares"
        holds.append(f"every unmasked sum carries at least {shares}")
    return holds


def sensitivity_statement(mechanism: str, secure_aggregation: str | None) -> str:
    if mechanism == DP_SGD:
        return (
            "DP-SGD clips every example and adds its noise on the client that trains on "
            "it; the server cannot check either and trusts the client's code."
        )
    if secure_aggregation in (SEMI_HONEST, MALICIOUS):
        shares = (
            " Each client's noise share is trusted too: the server cannot see it."
            if mechanism == DISTRIBUTED_SKELLAM
            else ""
        )
        return (
            "Under secure aggregation the server sees only the sum, so it cannot check "
            "any one client's clip: the sensitivity C holds only for honest clients. What "
            "it checks (secagg.sum_check) is the unmasked sum: its total weight and, under "
            "central DP, that its norm is within what the contributors clipped to C can "
            "produce; a round beyond that is rejected. That bounds the total, not one "
            "client's share of it." + shares
        )
    if secure_aggregation == OFF:
        return (
            "Without secure aggregation the server re-clips every update to C with weight "
            "1 before summing, so the sensitivity holds whatever a client sends."
        )
    return "Unknown how updates travelled: see the run's secure-aggregation mode."


def published_statistics(
    mechanism: str,
    neighbouring: str,
    secure_aggregation: str | None,
    adaptive_clipping: bool,
    has_coordinator_epsilon: bool,
    has_cohort_commitment: bool = False,
) -> list[dict[str, str]]:
    """Everything a DP run publishes (and what it keeps private), with its protection."""
    stats = _released_statistics(mechanism, adaptive_clipping)
    if has_coordinator_epsilon:
        stats.append(
            {
                "name": "epsilon_coordinator_bound (ledger, metrics, summary.json)",
                "protection": "a function of the number of released rounds and the "
                "public parameters only (a client in every released round), not of who "
                "took part or of their data",
            }
        )
    stats.append(
        {
            "name": "round status (applied / aborted)",
            "protection": _status(neighbouring, secure_aggregation),
        }
    )
    if has_cohort_commitment:
        stats.append(
            {
                "name": "cohort_commitment (first ledger entry)",
                "protection": "a hash commitment to the secret cohort key: reveals no "
                "cohort until the operator opens it to an auditor",
            }
        )
    return stats + _unaccounted_statistics(mechanism)


def _released_statistics(mechanism: str, adaptive_clipping: bool) -> list[dict[str, str]]:
    """What every DP run publishes: the models, the server's evaluation, the parameters."""
    release = {
        CENTRAL_GAUSSIAN: "Gaussian noise added by the server",
        DP_FTRL: "Gaussian noise correlated across rounds, added by the server (DP-FTRL)",
        DISTRIBUTED_SKELLAM: "Skellam noise shares added by the clients",
    }.get(mechanism, "the mechanism's noise")
    return [
        {
            "name": "model (one per round)",
            "protection": f"accounted release: {release}; charged in the ledger before it "
            "was published",
        },
        {
            "name": "test_loss, test_accuracy",
            "protection": "central evaluation on the server's own test set: not client data",
        },
        {
            "name": "epsilon series (ledger, metrics, report)",
            "protection": "a function of public parameters (z, q, delta, the round count): "
            "reveals nothing about any client",
        },
        {
            "name": "noise multiplier z, clip norm C",
            "protection": "run parameters fixed before the run; they do not depend on who "
            "arrived"
            + (
                " (adaptive clipping moves C by a noised count, part of the accounted release)"
                if adaptive_clipping
                else ""
            ),
        },
    ]


def _unaccounted_statistics(mechanism: str) -> list[dict[str, str]]:
    """Side channels that are published unaccounted, and what stays in the private annex.
    Under distributed DP federated evaluation is not in the annex but refused: the
    coordinator, whom that epsilon is stated against, would read it in the clear."""
    timing = [
        {
            "name": "round duration (duration_s), the run's wall time (wall_s)",
            "protection": "private annex only, not published: a round lasts as long as its "
            "slowest sampled client, so its duration reveals who was sampled "
            "(privacy/dp/public_time.py); summary.json leaves the wall time out",
        },
        {
            "name": "timestamps (ledger entries; TensorBoard wall times; MLflow metric "
            "timestamps, run start and end)",
            "protection": "coarsened: each is the UTC hour its writer opened in, one value "
            "for the whole attempt, so no two published times measure a round. Not "
            "covered: an observer who watches the records appear while the run runs",
        },
        {
            "name": "clients connected",
            "protection": "not accounted: device availability is a side channel, not "
            "computed from client data",
        },
    ]
    annex = "private annex only (private/rounds.jsonl, mode 600): not published"
    if mechanism != DISTRIBUTED_SKELLAM:
        return [
            *timing,
            {
                "name": "cohort and survivor counts, drop reasons, clients' training loss, "
                "federated evaluation",
                "protection": annex,
            },
        ]
    return [
        *timing,
        {
            "name": "cohort and survivor counts, drop reasons, clients' training loss",
            "protection": annex,
        },
        {
            "name": "federated evaluation",
            "protection": "refused under distributed DP (eval.federated_every must be 0; "
            "devices refuse plain evaluation requests): each client's accuracy and loss "
            "would reach the coordinator in the clear, outside its epsilon",
        },
    ]


def _status(neighbouring: str, secure_aggregation: str | None) -> str:
    secagg = secure_aggregation in (SEMI_HONEST, MALICIOUS)
    if neighbouring == ADD_REMOVE and secagg:
        return (
            "reveals participation: under add/remove adjacency with secure aggregation "
            "whether a round aborts depends on the survivor count, which depends on "
            "whether the target took part; this is NOT covered by the epsilon"
        )
    if secure_aggregation is None:
        return (
            "reveals participation only under add/remove adjacency with secure "
            "aggregation (the run's mode is unknown here)"
        )
    if not secagg:
        return (
            "no participation signal: without secure aggregation every round releases "
            "(noise only when nobody arrived)"
        )
    return (
        f"no participation signal under {neighbouring} adjacency: the target stays in "
        "its round either way (with a zero update or swapped data), so the survivor "
        "count and the abort decision do not depend on its data"
    )


def assumptions_for(
    mechanism: str,
    privacy_unit: str,
    neighbouring: str,
    sampling: str,
    epsilon: float,
    delta: float,
    secure_aggregation: str | None = None,
) -> dict[str, list[str]]:
    """Who sees what, who is trusted with what, what is protected and what is not.
    `secure_aggregation`: "off", "semi_honest" or "malicious" when the run's config is
    known."""
    protected = [
        f"Against observers of what is published: every released model together is "
        f"({epsilon:.4g}, {delta:.3g})-differentially private under {sampling} sampling, "
        f"{neighbouring_protects(neighbouring, privacy_unit)}",
        "Everything computed from the released models afterwards (post-processing "
        "costs no privacy).",
    ]
    trust = list(_TRUST.get(mechanism, []))
    if mechanism in (CENTRAL_GAUSSIAN, DP_FTRL) and secure_aggregation == OFF:
        # The server sees each update, so it enforces the clip itself.
        trust = [item for item in trust if not item.startswith("Clients are trusted to clip")]
        trust.append(sensitivity_statement(mechanism, secure_aggregation))
    secagg = secure_aggregation_text(secure_aggregation)
    if secagg is not None:
        trust.append(secagg)
    not_protected = list(_NOT_PROTECTED)
    if mechanism == DP_FTRL:
        # Its epsilon claims no amplification by sampling: nothing here rests on one.
        not_protected = [
            _FTRL_COHORTS if item is _NOT_PROTECTED[0] else item
            for item in not_protected
            if item is not _AMPLIFICATION
        ]
    if neighbouring != ADD_REMOVE:
        not_protected.insert(
            0,
            f"Whether a {privacy_unit} took part: the {neighbouring} adjacency protects "
            "the content of its data, not its participation.",
        )
    return {
        "who_sees_what": who_sees_what(mechanism, secure_aggregation),
        "trust": trust,
        "protected": protected,
        "not_protected": not_protected,
    }


def trust_model_markdown() -> str:
    """The README-level trust model: who sees what per mode, each adversary's epsilon
    and its assumptions."""
    return "\n".join(
        [
            "| mode | the coordinator sees | cohort members see | observers of the "
            "published files see |",
            "| --- | --- | --- | --- |",
            "| central DP, no secure aggregation | each client's clipped update, the "
            "un-noised sum, every cohort | nothing of the cohort | noised models, "
            "public run files |",
            "| central DP, semi-honest secure aggregation | the un-noised sum, every cohort "
            "| their masking-graph neighbours | noised models, public run files |",
            "| central DP, malicious-mode secure aggregation | the un-noised sum, every "
            "cohort | the signed survivor set of their rounds | noised models, public "
            "run files |",
            "| distributed DP (semi-honest or malicious) | sums already carrying the honest "
            "clients' noise shares, every cohort | neighbours (semi-honest) or the survivor "
            "set (malicious) | noised models, public run files |",
            "",
            "Each adversary's epsilon (report.json `adversaries`):",
            "",
            "- **Observers** of the published models and run files: `epsilon`, amplified "
            "by sampling. Holds if cohorts stay secret (`cohort_source` csprng; with "
            "`dp.seeded_cohorts` the run is accounted with q = 1 instead), if the private "
            "annex (`private/`) stays private, and, under secure aggregation with central "
            "DP, if clients clip honestly (the server cannot check the clip).",
            "- **The coordinator** (and cohort members, who know at most what it knows of "
            "the cohorts): under central DP a trusted curator, no epsilon holds against "
            "it. Under distributed DP each client's own epsilon, unamplified, from the "
            "rounds it took part in (individual accounting, Feldman & Zrnic 2021); the "
            "public report gives the bound for a client in every round, the operator's "
            "report each client's figure. It assumes enough honest "
            "clients' noise shares in every unmasked sum and, in semi-honest mode, a "
            "server that follows the protocol (it could show clients different survivor "
            "sets); malicious mode binds a deviating server through the signed survivor "
            "set.",
            '- `dp.budget_against = "coordinator"` (distributed DP only) caps the '
            "coordinator's bound (a client in every released round) instead of the "
            "observers' figure.",
        ]
    )
