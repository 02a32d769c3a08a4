"""The trust assumptions behind each mechanism, in plain words for the report."""

from __future__ import annotations

from .vocabulary import CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM, DP_SGD

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
        "It assumes enough honest clients: a round is decoded only if at least the "
        "calibrated minimum number of noise shares arrived; clients colluding with the "
        "server can subtract their own shares and weaken the noise accordingly.",
        "Clients are trusted to clip, round and add their noise share as specified; the "
        "secure aggregation protocol is trusted to reveal only the modular sum.",
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
    "off": "Secure aggregation was off in this run: the server saw each client's clipped "
    "update in the clear.",
    "semi_honest": "Secure aggregation ran in semi-honest mode: individual updates are "
    "hidden from a server that follows the protocol; a server that deviates from it "
    "(substitutes clients' keys, tells clients different stories about who dropped) is "
    "not guarded against.",
    "malicious": "Secure aggregation ran in malicious-server mode: clients checked each "
    "other's signed keys against the operator's roster and co-signed the survivor set "
    "before unmasking, so even a server that deviates learns only sums over at least the "
    "threshold of clients, provided the roster reached the clients by a channel the server "
    "does not control.",
}

_NOT_PROTECTED = [
    "Cohort membership and participation metadata: which clients were selected, "
    "which dropped out, how many took part, timing and network identifiers.",
    "Side channels: timing, message sizes, device behaviour, floating-point artefacts "
    "of the noise sampler.",
    "Colluding clients beyond the secure-aggregation threshold, or a server that "
    "deviates from the protocol where it is trusted (see above).",
    "Anything released outside this ledger: un-noised metrics, evaluations on private "
    "data, hyperparameter searches over repeated runs.",
    "Sampling amplification assumes the sampling really is as declared and that the "
    "adversary does not learn who was sampled.",
]


def assumptions_for(
    mechanism: str,
    privacy_unit: str,
    neighbouring: str,
    sampling: str,
    epsilon: float,
    delta: float,
    secure_aggregation: str | None = None,
) -> dict[str, list[str]]:
    """Who is trusted with what, what is protected and what is not. `secure_aggregation`:
    "off", "semi_honest" or "malicious" when the run's config is known."""
    relation = "adding or removing" if neighbouring == "add_remove" else "replacing"
    protected = [
        f"Whether any single {privacy_unit} took part, and what their data was: every "
        f"released model together is ({epsilon:.4g}, {delta:.3g})-differentially private "
        f"with respect to {relation} one {privacy_unit}'s data, under {sampling} sampling.",
        "Everything computed from the released models afterwards (post-processing "
        "costs no privacy).",
    ]
    trust = list(_TRUST.get(mechanism, []))
    if secure_aggregation in _SECURE_AGGREGATION:
        trust.append(_SECURE_AGGREGATION[secure_aggregation])
    return {
        "trust": trust,
        "protected": protected,
        "not_protected": list(_NOT_PROTECTED),
    }
