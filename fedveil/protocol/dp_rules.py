"""The DP rule table: which mechanism x accountant x sampling x neighbouring combinations
are sound, why, and why each other combination is refused.

One table, read by the run config's validator (fedveil.config.run), the DP plan and
DpConfig (privacy/dp/plan.py, config.py), the accountant registry's tests
(privacy/dp/accounting.py), `fedveil privacy verify` (privacy/dp/verify.py) and the
report (privacy/dp/assumptions.py). It lives in the core so that the config layer,
which may not import fedveil.privacy, reads the same rows as the privacy layer.

Names are the ledger's (signed records: they never change): mechanisms
central_gaussian, distributed_skellam, dp_sgd. A run config names the mechanism it
wants as dp.mechanism = central | distributed (`MECHANISM_OF_CONFIG`).

Contract:
- `SOUND` rows: a combination is sound iff some row lists it; within a row the
  accountants are ordered tightest first, and `auto` resolves to the first.
- `REFUSALS` rows: every combination no `SOUND` row lists is matched by one (a test
  checks it), so every refusal has its reason; a row with `secure_aggregation` set
  refuses a relation the accountants model but the run's published outputs do not.
- Adding a mechanism or accountant: one `SOUND` row (and `REFUSALS` rows for what it
  does not cover), plus, for an accountant, one registered class in accounting.py.

Plain strings (not Enums) so that they round-trip through JSON ledgers unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CENTRAL_GAUSSIAN = "central_gaussian"
DISTRIBUTED_SKELLAM = "distributed_skellam"
DP_SGD = "dp_sgd"
# DP-FTRL (privacy/dp/ftrl/): central noise correlated across rounds; privacy from the
# participation schema (min separation, max participations), not from sampling.
DP_FTRL = "dp_ftrl"
MECHANISMS = (CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM, DP_SGD, DP_FTRL)
# Mechanisms whose privacy rests on how cohorts are sampled (all but DP-FTRL's schema).
SAMPLED_MECHANISMS = (CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM, DP_SGD)
GAUSSIAN_MECHANISMS = (CENTRAL_GAUSSIAN, DP_SGD)

# dp.mechanism (the user's intent: who adds the noise) -> the ledger's mechanism (which
# noise, where). 'none' has no mechanism.
MECHANISM_OF_CONFIG: dict[str, str] = {
    "central": CENTRAL_GAUSSIAN,
    "distributed": DISTRIBUTED_SKELLAM,
    "ftrl": DP_FTRL,
}
CONFIG_OF_MECHANISM: dict[str, str] = {v: k for k, v in MECHANISM_OF_CONFIG.items()}

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
GAUSSIAN_ACCOUNTANTS = (PLD, PRV, RDP, DPA_RDP)
# Accountants only old ledgers name -> the one a new run uses in their place.
LEGACY_ACCOUNTANTS: dict[str, str] = {SKELLAM_RDP: SKELLAM_RDP_INTEGER}

_SKELLAM_WHY = (
    "Skellam noise is dominated by a Gaussian only at the level of RDP curves, proven at "
    "integer Renyi orders (Agarwal, Kairouz and Liu 2021), and its noise grows with the "
    "cohort: skellam_rdp_integer composes that curve, amplified by bounds that hold for "
    "any mechanism (subsampled_rdp.py)"
)


_FTRL_WHY = (
    "DP-FTRL releases every prefix sum with noise correlated by its factorisation: one "
    "Gaussian mechanism over the factorisation's sensitivity for the participation "
    "schema (Kairouz et al. 2021; Choquette-Choo et al. 2023), accounted exactly with "
    "dp-accounting's PLD, without amplification: the fixed-size cohorts need not be secret"
)


@dataclass(frozen=True)
class SoundRow:
    """These accountants (tightest first) bound these mechanisms under this sampling
    scheme and neighbouring relation; `why` says on what grounds."""

    mechanisms: tuple[str, ...]
    sampling: str
    neighbouring: str
    accountants: tuple[str, ...]
    why: str


SOUND: tuple[SoundRow, ...] = (
    SoundRow(
        GAUSSIAN_MECHANISMS,
        POISSON,
        ADD_REMOVE,
        (PLD, PRV, RDP, DPA_RDP),
        "the Poisson-subsampled Gaussian under add/remove: modelled by Opacus (RDP, PRV) "
        "and dp-accounting (PLD, RDP); PLD is the tightest",
    ),
    SoundRow(
        GAUSSIAN_MECHANISMS,
        POISSON,
        REPLACE_ONE,
        (PLD,),
        "replace-one moves the sum by up to 2C; of the libraries only dp-accounting's PLD "
        "models it under Poisson sampling",
    ),
    SoundRow(
        GAUSSIAN_MECHANISMS,
        POISSON,
        ZERO_OUT,
        (PLD, DPA_RDP, RDP, PRV),
        "zero-out (dp-accounting's REPLACE_SPECIAL): with Gaussian noise the pair of output "
        "distributions is add/remove's, so every add/remove accountant models it "
        "(asynchronous DP accounts its unsampled releases with Opacus' RDP)",
    ),
    SoundRow(
        GAUSSIAN_MECHANISMS,
        FIXED,
        REPLACE_ONE,
        (DPA_RDP,),
        "fixed-size sampling without replacement: only dp-accounting's RDP models it "
        "(Wang, Balle and Kasiviswanathan 2019)",
    ),
    SoundRow(
        (DISTRIBUTED_SKELLAM,),
        POISSON,
        REPLACE_ONE,
        (SKELLAM_RDP_INTEGER,),
        _SKELLAM_WHY + "; the target's noise share stays in the sum",
    ),
    SoundRow(
        (DISTRIBUTED_SKELLAM,),
        POISSON,
        ZERO_OUT,
        (SKELLAM_RDP_INTEGER,),
        _SKELLAM_WHY + "; the target still adds its noise share, so the variance is the "
        "same in both worlds",
    ),
    SoundRow(
        (DISTRIBUTED_SKELLAM,),
        FIXED,
        REPLACE_ONE,
        (SKELLAM_RDP_INTEGER,),
        _SKELLAM_WHY + "; fixed-size sampling through Wang, Balle and Kasiviswanathan's "
        "general bound",
    ),
    SoundRow(
        (DP_FTRL,),
        FIXED,
        ZERO_OUT,
        (PLD,),
        _FTRL_WHY + "; zero-out: one participation's column of C^-1 at most C in norm",
    ),
    SoundRow(
        (DP_FTRL,),
        FIXED,
        REPLACE_ONE,
        (PLD,),
        _FTRL_WHY + "; replace-one doubles the sensitivity",
    ),
)

# The run-config keys a refusal may name, and the plain names the table matches them as.
CONFIG_KEYS = {
    "mechanism": "dp.mechanism",
    "accountant": "dp.accountant",
    "sampling": "server.sampling",
    "neighbouring": "dp.neighbouring",
    "secure_aggregation": "secagg.enabled",
}


@dataclass(frozen=True)
class Refusal:
    """A combination refused, and why. None in a match field: any value.

    `field` is what to change ('neighbouring' or 'accountant'); `context` names the
    other settings the refusal depends on, shown in the error; `fix` what to use.
    """

    field: str
    why: str
    fix: str
    context: tuple[str, ...] = ()
    mechanisms: tuple[str, ...] | None = None
    samplings: tuple[str, ...] | None = None
    neighbourings: tuple[str, ...] | None = None
    accountants: tuple[str, ...] | None = None
    secure_aggregation: bool | None = None

    def matches(
        self,
        mechanism: str,
        accountant: str,
        sampling: str,
        neighbouring: str,
        secure_aggregation: bool,
    ) -> bool:
        """Whether this row refuses the combination (`accountant` AUTO: only the rows that
        refuse whatever the accountant)."""
        if self.accountants is not None and accountant not in self.accountants:
            return False
        return (
            (self.mechanisms is None or mechanism in self.mechanisms)
            and (self.samplings is None or sampling in self.samplings)
            and (self.neighbourings is None or neighbouring in self.neighbourings)
            and (self.secure_aggregation is None or secure_aggregation == self.secure_aggregation)
        )

    def message(self, shown: Mapping[str, str]) -> str:
        """The error naming the run config's keys: `shown` maps each of CONFIG_KEYS'
        fields to its value as the user wrote it (repr'd, or 'true')."""
        parts = [f"{CONFIG_KEYS[name]} = {shown[name]}" for name in self.context]
        if len(parts) > 1:
            context = " with " + ", ".join(parts[:-1]) + " and " + parts[-1]
        else:
            context = "".join(f" with {p}" for p in parts)
        return f"{CONFIG_KEYS[self.field]} = {shown[self.field]}{context}: {self.why}; {self.fix}"


# First match wins (the order is the order the checks used to run in).
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "sampling",
        "DP-FTRL draws fixed-size cohorts among the clients its participation schema "
        "allows (no amplification by sampling)",
        "use server.sampling = 'fixed'",
        context=("mechanism",),
        mechanisms=(DP_FTRL,),
        samplings=(POISSON,),
    ),
    Refusal(
        "neighbouring",
        "the schema bounds participations, not presence",
        "use 'auto' (zero_out) or 'replace_one'",
        context=("mechanism",),
        mechanisms=(DP_FTRL,),
        neighbourings=(ADD_REMOVE,),
    ),
    Refusal(
        "accountant",
        "its epsilon is one Gaussian mechanism over the factorisation's sensitivity (PLD)",
        "use 'auto' or 'pld'",
        context=("mechanism",),
        mechanisms=(DP_FTRL,),
        accountants=(PRV, RDP, DPA_RDP, SKELLAM_RDP_INTEGER, SKELLAM_RDP),
    ),
    Refusal(
        "neighbouring",
        "no accountant bounds this pair",
        "use Poisson sampling or replace_one",
        context=("sampling",),
        samplings=(FIXED,),
        neighbourings=(ADD_REMOVE,),
    ),
    Refusal(
        "neighbouring",
        "no accountant bounds this pair",
        "use replace_one (or 'auto')",
        context=("sampling",),
        mechanisms=SAMPLED_MECHANISMS,
        samplings=(FIXED,),
        neighbourings=(ZERO_OUT,),
    ),
    Refusal(
        "neighbouring",
        "not sound for distributed DP (the target's noise share leaves with it)",
        "use 'auto' or 'zero_out'",
        mechanisms=(DISTRIBUTED_SKELLAM,),
        neighbourings=(ADD_REMOVE,),
    ),
    Refusal(
        "accountant",
        "evaluates the Skellam bound at fractional Renyi orders, for which it is not "
        "proven; kept only so that old ledgers verify as what they were",
        "use 'auto' or 'skellam_rdp_integer'",
        mechanisms=(DISTRIBUTED_SKELLAM,),
        accountants=(SKELLAM_RDP,),
    ),
    Refusal(
        "accountant",
        "not sound for distributed DP (Skellam)",
        "use 'auto' or 'skellam_rdp_integer'",
        mechanisms=(DISTRIBUTED_SKELLAM,),
        accountants=GAUSSIAN_ACCOUNTANTS,
    ),
    Refusal(
        "neighbouring",
        "refused. Whether a secure-aggregation round aborts depends on how many sampled "
        "clients survive, and that public abort status then depends on whether the target "
        "was sampled, which add/remove does not account for",
        "use 'auto' (zero_out under secure aggregation) or 'zero_out'",
        context=("mechanism", "secure_aggregation", "sampling"),
        mechanisms=(CENTRAL_GAUSSIAN,),
        samplings=(POISSON,),
        neighbourings=(ADD_REMOVE,),
        secure_aggregation=True,
    ),
    Refusal(
        "accountant",
        "only for dp.mechanism = 'distributed'",
        "use 'auto' for central DP",
        mechanisms=GAUSSIAN_MECHANISMS,
        accountants=SKELLAM_ACCOUNTANTS,
    ),
    Refusal(
        "accountant",
        "Opacus' RDP and PRV model only add/remove's shift of C, and dp-accounting's RDP "
        "models replace-one only for sampling without replacement",
        "use 'auto' or 'pld'",
        context=("sampling", "neighbouring"),
        mechanisms=GAUSSIAN_MECHANISMS,
        samplings=(POISSON,),
        neighbourings=(REPLACE_ONE,),
        accountants=(PRV, RDP, DPA_RDP),
    ),
    Refusal(
        "accountant",
        "only dp-accounting's RDP models fixed-size sampling without replacement (Wang, "
        "Balle and Kasiviswanathan 2019)",
        "use 'auto' or 'dpa_rdp'",
        context=("sampling",),
        mechanisms=GAUSSIAN_MECHANISMS,
        samplings=(FIXED,),
        accountants=(PLD, PRV, RDP),
    ),
)


# The relations refused only because of what a secure-aggregation run publishes:
# (mechanism, sampling, neighbouring, secure aggregation) -> why.
REFUSED_NEIGHBOURING: dict[tuple[str, str, str, bool], str] = {
    (mechanism, sampling, neighbouring, row.secure_aggregation): row.why
    for row in REFUSALS
    if row.secure_aggregation is not None
    for mechanism in row.mechanisms or MECHANISMS
    for sampling in row.samplings or SAMPLING_SCHEMES
    for neighbouring in row.neighbourings or NEIGHBOURING_RELATIONS
}


def refusal(
    mechanism: str,
    accountant: str,
    sampling: str,
    neighbouring: str,
    secure_aggregation: bool = False,
) -> Refusal | None:
    """The first row refusing the combination (None: accepted). `accountant` may be
    AUTO (then only what no accountant could make sound is refused); `neighbouring`
    AUTO resolves through `default_neighbouring`, which never picks a refused one."""
    if neighbouring == AUTO:
        neighbouring = default_neighbouring(mechanism, sampling, secure_aggregation)
    for row in REFUSALS:
        if row.matches(mechanism, accountant, sampling, neighbouring, secure_aggregation):
            return row
    return None


def sound_rows(mechanism: str, sampling: str, neighbouring: str) -> tuple[SoundRow, ...]:
    """The rows that list this combination."""
    return tuple(
        row
        for row in SOUND
        if mechanism in row.mechanisms
        and row.sampling == sampling
        and row.neighbouring == neighbouring
    )


def sound_accountants(mechanism: str, sampling: str, neighbouring: str) -> tuple[str, ...]:
    """Accountants whose epsilon is a proven upper bound for this mechanism and setting,
    tightest first (`SOUND`)."""
    out: list[str] = []
    for row in sound_rows(mechanism, sampling, neighbouring):
        out.extend(a for a in row.accountants if a not in out)
    return tuple(out)


def supported_accountants(sampling: str, neighbouring: str) -> tuple[str, ...]:
    """Accountants able to bound this sampling scheme under this neighbouring relation,
    for some mechanism."""
    out: list[str] = []
    for row in SOUND:
        if row.sampling == sampling and row.neighbouring == neighbouring:
            out.extend(a for a in row.accountants if a not in out)
    return tuple(out)


def legacy_twins(accountants: tuple[str, ...]) -> tuple[str, ...]:
    """The legacy accountants whose successors are among `accountants`."""
    return tuple(old for old, new in LEGACY_ACCOUNTANTS.items() if new in accountants)


def verifiable_accountants(mechanism: str, sampling: str, neighbouring: str) -> tuple[str, ...]:
    """What a ledger may name for this setting: the sound accountants, and the legacy
    ones old ledgers name in their place (a ledger verifies as what it was)."""
    sound = sound_accountants(mechanism, sampling, neighbouring)
    return sound + legacy_twins(sound)


def neighbouring_refusal(
    mechanism: str, sampling: str, neighbouring: str, secure_aggregation: bool
) -> str | None:
    """Why this relation is refused for the run whatever the accountant (None: it is not)."""
    row = refusal(mechanism, AUTO, sampling, neighbouring, secure_aggregation)
    return None if row is None else row.why


def default_neighbouring(mechanism: str, sampling: str, secure_aggregation: bool = False) -> str:
    """What `auto` means for dp.neighbouring.

    Fixed-size sampling: replace-one. Poisson: zero-out for distributed DP (the target's
    honest noise share stays) and whenever updates travel through secure aggregation
    (the abort-status refusal in REFUSALS); add/remove for central DP in the clear, so its
    existing epsilons do not change.
    """
    if mechanism == DP_FTRL:  # the schema's zero-out: a client's rows replaced by zeros
        return ZERO_OUT
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
