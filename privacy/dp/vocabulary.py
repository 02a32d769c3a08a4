"""The closed vocabularies of the DP layer: mechanisms, units, sampling, relations, accountants.

Plain strings (not Enums) so that they round-trip through JSON ledgers unchanged.
"""

from __future__ import annotations

CENTRAL_GAUSSIAN = "central_gaussian"
DISTRIBUTED_SKELLAM = "distributed_skellam"
DP_SGD = "dp_sgd"
# DP-FTRL (privacy/dp/ftrl/): correlated central noise, accounted by its own rule
# (one Gaussian over the factorisation's sensitivity), not by composing events.
DP_FTRL = "dp_ftrl"
MECHANISMS = (CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM, DP_SGD, DP_FTRL)

USER = "user"
EXAMPLE = "example"
PRIVACY_UNITS = (USER, EXAMPLE)

POISSON = "poisson"
FIXED = "fixed"  # fixed-size sampling without replacement
SAMPLING_SCHEMES = (POISSON, FIXED)

ADD_REMOVE = "add_remove"
REPLACE_ONE = "replace_one"
# dp-accounting's REPLACE_SPECIAL: the target's record is replaced by a zero
# contribution; the target still takes part (and, under distributed DP, still adds
# its noise share). Hides what a client sent, not whether it took part.
ZERO_OUT = "zero_out"
NEIGHBOURING_RELATIONS = (ADD_REMOVE, REPLACE_ONE, ZERO_OUT)

PLD = "pld"  # Google dp-accounting privacy loss distributions
PRV = "prv"  # Opacus privacy random variables
RDP = "rdp"  # Opacus Renyi DP
DPA_RDP = "dpa_rdp"  # Google dp-accounting Renyi DP (the only one for fixed-size sampling)
# RDP from the Skellam curve (Gaussian-equivalent z) amplified with bounds that hold
# for ANY mechanism (subsampled_rdp.py), at integer Renyi orders only, the orders
# Agarwal, Kairouz and Liu's Skellam bound is proven for: the only accountant sound
# for distributed DP.
SKELLAM_RDP_INTEGER = "skellam_rdp_integer"
# The same at the fractional orders 1.1-10.9 as well (dp-accounting's grid), where the
# Skellam bound is not proven. Ledgers written before skellam_rdp_integer name it; they
# still verify as what they were, recomputed with it. No new run uses it.
SKELLAM_RDP = "skellam_rdp"
AUTO = "auto"
ACCOUNTANTS = (PLD, PRV, RDP, DPA_RDP, SKELLAM_RDP_INTEGER, SKELLAM_RDP)
SKELLAM_ACCOUNTANTS = (SKELLAM_RDP_INTEGER, SKELLAM_RDP)
# Accountants only old ledgers name -> the one a new run uses in their place.
LEGACY_ACCOUNTANTS: dict[str, str] = {SKELLAM_RDP: SKELLAM_RDP_INTEGER}

# Which accountants model which (sampling, neighbouring) pair. Opacus models Poisson
# add/remove (and so zero-out, below); dp-accounting's PLD adds Poisson replace-one and zero-out
# (which for a Poisson-sampled Gaussian with central noise composes exactly like
# add/remove); only dp-accounting's RDP models fixed-size sampling without
# replacement (replace-one, Wang-Balle-Kasiviswanathan 2019). Fixed-size with
# add/remove or zero-out is modelled by none. skellam_rdp models the pairs under
# which a distributed mechanism's noise variance is the same in both worlds.
SUPPORTED_ACCOUNTANTS: dict[tuple[str, str], tuple[str, ...]] = {
    (POISSON, ADD_REMOVE): (PLD, PRV, RDP, DPA_RDP),
    (POISSON, REPLACE_ONE): (PLD, SKELLAM_RDP_INTEGER),
    # Opacus' RDP and PRV last: with central noise zero-out composes exactly as
    # add/remove (same pair of output distributions), so they model it too; asynchronous
    # DP (participation.py) accounts its unsampled releases with Opacus' RDP.
    (POISSON, ZERO_OUT): (PLD, DPA_RDP, SKELLAM_RDP_INTEGER, RDP, PRV),
    (FIXED, REPLACE_ONE): (DPA_RDP, SKELLAM_RDP_INTEGER),
}


def supported_accountants(sampling: str, neighbouring: str) -> tuple[str, ...]:
    """Accountants able to bound this sampling scheme under this neighbouring relation."""
    return SUPPORTED_ACCOUNTANTS.get((sampling, neighbouring), ())


def legacy_twins(accountants: tuple[str, ...]) -> tuple[str, ...]:
    """The legacy accountants whose successors are among `accountants`."""
    return tuple(old for old, new in LEGACY_ACCOUNTANTS.items() if new in accountants)


def verifiable_accountants(mechanism: str, sampling: str, neighbouring: str) -> tuple[str, ...]:
    """What a ledger may name for this setting: the sound accountants, and the legacy
    ones old ledgers name in their place (a ledger verifies as what it was)."""
    sound = sound_accountants(mechanism, sampling, neighbouring)
    return sound + legacy_twins(sound)


def sound_accountants(mechanism: str, sampling: str, neighbouring: str) -> tuple[str, ...]:
    """Accountants whose epsilon is a proven upper bound for this mechanism and setting.

    Distributed Skellam is only dominated by a Gaussian at the level of RDP curves
    (skellam.py), and its noise grows with the cohort, so only skellam_rdp_integer (that
    curve at integer orders, amplified by bounds valid for any mechanism) is sound for
    it; and never under add/remove, where the target's noise share leaves with it (a
    change of variance, which no shift-based bound covers). The Gaussian mechanisms use the tight
    Gaussian-specific accountants; the Skellam accountants are not offered for them.
    """
    supported = supported_accountants(sampling, neighbouring)
    if mechanism == DISTRIBUTED_SKELLAM:
        if neighbouring == ADD_REMOVE:
            return ()
        return tuple(a for a in supported if a in SKELLAM_ACCOUNTANTS)
    return tuple(a for a in supported if a not in SKELLAM_ACCOUNTANTS)


# Relations an accountant models but a run may not use, because the run publishes
# something the relation does not cover: (mechanism, sampling, neighbouring, secure
# aggregation) -> why. Under central DP with secure aggregation and Poisson sampling a
# round aborts when too few sampled clients survive to unmask; that abort status is
# public and depends on whether the target was sampled, which add/remove (the target
# absent from the round) does not account for; zero-out keeps the target in the round.
# fedveil/config/run.py refuses the same combinations (the core cannot import this).
REFUSED_NEIGHBOURING: dict[tuple[str, str, str, bool], str] = {
    (CENTRAL_GAUSSIAN, POISSON, ADD_REMOVE, True): (
        "the public abort status of a secure-aggregation round depends on whether the "
        "target was sampled; use zero_out"
    ),
}


def neighbouring_refusal(
    mechanism: str, sampling: str, neighbouring: str, secure_aggregation: bool
) -> str | None:
    """Why this relation is refused for the run (None: it is not)."""
    return REFUSED_NEIGHBOURING.get((mechanism, sampling, neighbouring, secure_aggregation))


def default_neighbouring(mechanism: str, sampling: str, secure_aggregation: bool = False) -> str:
    """What `auto` means for dp.neighbouring.

    Fixed-size sampling: replace-one. Poisson: zero-out for distributed DP (the target's
    honest noise share stays) and whenever updates travel through secure aggregation
    (REFUSED_NEIGHBOURING); add/remove for central DP in the clear, so its existing
    epsilons do not change.
    """
    if sampling == FIXED:
        return REPLACE_ONE
    if mechanism == DISTRIBUTED_SKELLAM or secure_aggregation:
        return ZERO_OUT
    return ADD_REMOVE


def default_accountant(mechanism: str, sampling: str, neighbouring: str) -> str:
    """The tightest sound accountant for the combination (what `auto` resolves to)."""
    sound = sound_accountants(mechanism, sampling, neighbouring)
    if not sound:
        raise ValueError(
            f"no accountant is sound for mechanism={mechanism!r} with sampling={sampling!r} "
            f"and neighbouring={neighbouring!r}; "
            f"use neighbouring={default_neighbouring(mechanism, sampling)!r}"
        )
    return sound[0]
