"""Accountants behind one interface and a registry: Opacus (RDP, PRV), Google
dp-accounting (PLD, RDP) and the general subsampled-RDP bounds of subsampled_rdp.py
(skellam_rdp_integer, and the legacy skellam_rdp that old ledgers name).

Each accountant is a registered `Accountant` class that declares the (mechanism,
sampling, neighbouring) combinations it is sound for; those declarations equal the rule
table (fedveil.protocol.dp_rules) and what the run config enforces (tests check both).
`create_accountant(name)` gives the instance `compute_epsilon` uses.

Stateless: an accountant composes a list of events each time (grouped into
constant-parameter blocks and handed to the libraries, which recompute epsilon from
(q, z, T)), unlike Opacus' stateful history, so a ledger's epsilons are re-verified from
its entries alone. skellam_rdp_integer composes the Gaussian-equivalent curve of
distributed Skellam (skellam.py), amplified by bounds valid for any mechanism.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any, ClassVar, TypeVar

import numpy as np

from fedveil.protocol.dp_rules import (
    ADD_REMOVE,
    DISTRIBUTED_SKELLAM,
    DP_FTRL,
    DPA_RDP,
    FIXED,
    GAUSSIAN_MECHANISMS,
    PLD,
    POISSON,
    PRV,
    RDP,
    REPLACE_ONE,
    SAMPLED_MECHANISMS,
    SKELLAM_ACCOUNTANTS,
    SKELLAM_RDP,
    SKELLAM_RDP_INTEGER,
    ZERO_OUT,
    sound_accountants,
    supported_accountants,
)

from .events import PrivacyEvent, group_events

# Opacus and dp-accounting are imported lazily: edge clients import this package for
# clipping and encoding with neither installed (they are server/simulation extras).

# PLD discretisation: pessimistic rounding keeps the result an upper bound; 1e-4
# stays within ~0.1% of the exact value at ~0.05-1.3 s per evaluation.
PLD_DISCRETIZATION = 1e-4


def _dpa_relation(neighbouring: str) -> Any:
    import dp_accounting

    return {
        "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
        # Zero-out: the target's record becomes a zero contribution. With central
        # noise a Poisson-sampled Gaussian composes exactly as under add/remove.
        "zero_out": dp_accounting.NeighboringRelation.REPLACE_SPECIAL,
    }[neighbouring]


def compute_epsilon(
    events: Iterable[PrivacyEvent],
    delta: float,
    accountant: str,
    *,
    mechanism: str | None = None,
) -> float:
    """Epsilon at `delta` of the composition of `events` (an upper bound; inf if unbounded).

    With `mechanism` given, an accountant that is not sound for it is refused
    (each accountant's `sound_for`), e.g. 'pld' for 'distributed_skellam'.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} is invalid; allowed: (0, 1)")
    grouped = group_events(events)
    if not grouped:
        return 0.0
    relations = {(e.sampling, e.neighbouring) for e in grouped}
    if len(relations) != 1:
        raise ValueError(
            f"events mix sampling/neighbouring pairs {sorted(relations)}; "
            "one run has one sampling scheme and one neighbouring relation"
        )
    ((sampling, neighbouring),) = relations
    chosen = create_accountant(accountant)
    if not chosen.models(sampling, neighbouring):
        # Only those that model it as a composition (the rule table also lists DP-FTRL's).
        allowed = tuple(
            name
            for name in supported_accountants(sampling, neighbouring)
            if create_accountant(name).models(sampling, neighbouring)
        )
        raise ValueError(
            f"accountant={accountant!r} does not model sampling={sampling!r} with "
            f"neighbouring={neighbouring!r}; allowed: {allowed}"
        )
    if mechanism is not None and not chosen.verifies(mechanism, sampling, neighbouring):
        allowed = sound_accountants(mechanism, sampling, neighbouring)
        raise ValueError(
            f"accountant={accountant!r} is not sound for mechanism={mechanism!r} with "
            f"sampling={sampling!r}, neighbouring={neighbouring!r}; allowed: {allowed}"
        )
    return _cached_epsilon(grouped, float(delta), accountant)


def individual_epsilon(
    events: Sequence[PrivacyEvent], delta: float, accountant: str = SKELLAM_RDP_INTEGER
) -> float:
    """One client's epsilon against an adversary who knows the cohorts (the coordinator).

    Composes the client's OWN releases (the rounds it took part in) without sampling
    amplification, q treated as 1 (individual accounting, Feldman and Zrnic 2021,
    "Individual privacy accounting via a Renyi filter": per-client RDP composes
    when each round's noise is fixed before the round). Uses the Skellam RDP curve
    alpha / (2 z^2) of each event's Gaussian-equivalent z (skellam_rdp at q = 1), so
    it is sound for distributed Skellam and, a fortiori, for Gaussian noise. The events'
    neighbouring relation must be zero_out or replace_one (not add_remove). `accountant`:
    skellam_rdp_integer, or the legacy skellam_rdp to recompute an old ledger's bound.
    """
    if accountant not in SKELLAM_ACCOUNTANTS:
        raise ValueError(f"accountant={accountant!r} is invalid; allowed: {SKELLAM_ACCOUNTANTS}")
    unsampled = [
        replace(event, sampling_rate=1.0, sampling=POISSON, population_size=None)
        for event in events
    ]
    if not unsampled:
        return 0.0
    return compute_epsilon(unsampled, delta, accountant)


@lru_cache(maxsize=512)
def _cached_epsilon(grouped: tuple[PrivacyEvent, ...], delta: float, accountant: str) -> float:
    # The budget check before a round and the ledger entry after it ask for the same
    # composition; caching makes the second call free.
    return create_accountant(accountant).epsilon(grouped, delta)


def skellam_orders(accountant: str = SKELLAM_RDP_INTEGER) -> tuple[float, ...]:
    """The Renyi orders a Skellam accountant evaluates: integer ones (skellam_rdp_integer),
    or the legacy grid with fractional orders (skellam_rdp, old ledgers only)."""
    from .subsampled_rdp import INTEGER_ORDERS, LEGACY_FRACTIONAL_ORDERS

    return LEGACY_FRACTIONAL_ORDERS if accountant == SKELLAM_RDP else INTEGER_ORDERS


def _skellam_rdp_epsilon(grouped: tuple[PrivacyEvent, ...], delta: float, accountant: str) -> float:
    from .subsampled_rdp import rdp_to_epsilon

    rdp = sum(event.steps * skellam_rdp_curve(event, accountant) for event in grouped)
    orders = np.asarray(skellam_orders(accountant), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return _finite_or_inf(rdp_to_epsilon(orders, rdp, delta))


def skellam_rdp_curve(event: PrivacyEvent, accountant: str = SKELLAM_RDP_INTEGER) -> np.ndarray:
    """Per-step RDP of `event` under a Skellam accountant, at its `skellam_orders`.

    The base curve is alpha / (2 z^2) with z the Gaussian-equivalent noise multiplier
    (skellam.py); under replace-one two outputs differ by 2B, so z/2 (the events.py
    convention). Sampling: q = 1 -> the base curve; Poisson -> the mixture bound
    (the sampled target adds its own noise share); fixed-size -> Wang, Balle and
    Kasiviswanathan's general bound.
    """
    return _skellam_rdp_curve(
        event.noise_multiplier,
        event.sampling_rate,
        event.sampling,
        event.neighbouring,
        skellam_orders(accountant),
    )


@lru_cache(maxsize=4096)
def _skellam_rdp_curve(
    noise_multiplier: float,
    sampling_rate: float,
    sampling: str,
    neighbouring: str,
    grid: tuple[float, ...],
) -> np.ndarray:
    from .subsampled_rdp import (
        gaussian_curve,
        poisson_mixture_rdp,
        without_replacement_general_rdp,
    )

    z = noise_multiplier / 2 if neighbouring == REPLACE_ONE else noise_multiplier
    base = gaussian_curve(z)
    orders = np.asarray(grid, dtype=np.float64)
    if sampling_rate >= 1.0:
        curve = base(orders)
    elif sampling == FIXED:
        curve = without_replacement_general_rdp(base, sampling_rate, orders)
    else:
        curve = poisson_mixture_rdp(base, sampling_rate, orders)
    curve.setflags(write=False)  # shared through the cache
    return curve


def _opacus_rdp_epsilon(grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
    # Same computation as Opacus' RDPAccountant.get_privacy_spent (RDP adds up over
    # steps and blocks), but with the per-step curve of each (q, z) cached: a run
    # whose z varies per round (dropouts) would otherwise redo every block each round.
    from opacus.accountants.analysis import rdp as opacus_rdp

    rdp = sum(
        event.steps * _opacus_rdp_curve(event.sampling_rate, event.noise_multiplier)
        for event in grouped
    )
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # "Optimal order is the largest alpha" only means the bound could be tighter.
        warnings.simplefilter("ignore", UserWarning)
        epsilon, _ = opacus_rdp.get_privacy_spent(orders=_opacus_orders(), rdp=rdp, delta=delta)
    return _finite_or_inf(epsilon)


@lru_cache(maxsize=4096)
def _opacus_rdp_curve(sampling_rate: float, noise_multiplier: float) -> np.ndarray:
    from opacus.accountants.analysis import rdp as opacus_rdp

    return np.asarray(
        opacus_rdp.compute_rdp(
            q=sampling_rate, noise_multiplier=noise_multiplier, steps=1, orders=_opacus_orders()
        )
    )


def _opacus_orders() -> list[float]:
    from opacus.accountants import RDPAccountant

    return list(RDPAccountant.DEFAULT_ALPHAS)


def _opacus_prv_epsilon(grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
    from opacus.accountants import PRVAccountant

    account = PRVAccountant()
    # Opacus' history is exactly a list of (noise_multiplier, sample_rate, steps) blocks.
    account.history = [(e.noise_multiplier, e.sampling_rate, e.steps) for e in grouped]
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _finite_or_inf(account.get_epsilon(delta=delta))


def _pld_epsilon(grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
    return _finite_or_inf(composed_pld(grouped).get_epsilon_for_delta(delta))


def composed_pld(events: Iterable[PrivacyEvent], discretization: float = PLD_DISCRETIZATION) -> Any:
    """The composed dp-accounting PLD the 'pld' accountant computes epsilon from (its
    privacy profile is what `fedveil.privacy.audit.tradeoff` audits against). A coarser
    `discretization` is faster and, rounding pessimistically, still an upper bound."""
    # The PLD of each constant-parameter block is cached: when z varies per round
    # (distributed DP with dropouts) only the block that grew is rebuilt (~1 s), and
    # composing the cached blocks is a few FFTs.
    total = None
    for event in group_events(events):
        block = _pld_block(event, discretization)
        total = block if total is None else total.compose(block)
    if total is None:
        raise ValueError("no privacy events: nothing to compose")
    return total


@lru_cache(maxsize=64)
def _pld_block(event: PrivacyEvent, discretization: float = PLD_DISCRETIZATION) -> Any:
    from dp_accounting.pld import privacy_loss_distribution

    # The same constructions dp-accounting's PLDAccountant uses for (Poisson-sampled)
    # Gaussian events. Its PLD measures sensitivity per record: under REPLACE_ONE it
    # shifts the two outputs by +-1 (distance 2C), so z is passed unchanged.
    relation = _dpa_relation(event.neighbouring)
    if event.sampling_rate >= 1.0:
        return privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=event.noise_multiplier / math.sqrt(event.steps),
            value_discretization_interval=discretization,
            neighboring_relation=relation,
        )
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=event.noise_multiplier,
        value_discretization_interval=discretization,
        sampling_prob=event.sampling_rate,
        neighboring_relation=relation,
    ).self_compose(event.steps)


def _dpa_rdp_epsilon(grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant

    relation = _dpa_relation(grouped[0].neighbouring)
    account = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    for event in grouped:
        z = event.noise_multiplier
        if event.neighbouring == REPLACE_ONE:
            # dp-accounting's RDP (sampling without replacement, Wang et al. 2019)
            # takes z relative to the distance between neighbouring outputs, which
            # for replace-one of C-clipped contributions is 2C: halve z.
            z = z / 2
        account.compose(_dpa_event(event, z))
    return _finite_or_inf(account.get_epsilon(delta))


def _dpa_event(event: PrivacyEvent, z: float) -> Any:
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(z)
    if event.sampling == FIXED:
        sampled: Any = dp_accounting.SampledWithoutReplacementDpEvent(
            source_dataset_size=event.population_size,
            sample_size=event.sample_size,
            event=gaussian,
        )
    elif event.sampling_rate >= 1.0:
        sampled = gaussian
    else:
        sampled = dp_accounting.PoissonSampledDpEvent(event.sampling_rate, gaussian)
    return dp_accounting.SelfComposedDpEvent(sampled, event.steps)


def _finite_or_inf(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else math.inf


# ------------------------------------------------------------------ the registry
Combination = tuple[str, str, str]  # (mechanism, sampling, neighbouring)


def _combinations(
    mechanisms: Iterable[str], pairs: Iterable[tuple[str, str]]
) -> frozenset[Combination]:
    return frozenset((m, s, n) for m in mechanisms for s, n in pairs)


class Accountant(ABC):
    """An accountant: the epsilon at `delta` of a composition of privacy events.

    `name` is what ledgers and dp.accountant call it. `sound_for` declares the
    (mechanism, sampling, neighbouring) combinations whose epsilon it bounds from
    above; a legacy accountant declares none and names its `successor`, whose
    combinations old ledgers naming it still verify under.
    """

    name: ClassVar[str]
    sound_for: ClassVar[frozenset[Combination]]
    successor: ClassVar[str | None] = None

    @abstractmethod
    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        """Epsilon of the composition of `grouped` (group_events' blocks); inf if unbounded."""

    def verifies_for(self) -> frozenset[Combination]:
        """What a ledger naming this accountant may record: its own combinations, or a
        legacy accountant's successor's."""
        if self.successor is not None:
            return create_accountant(self.successor).sound_for
        return self.sound_for

    def verifies(self, mechanism: str, sampling: str, neighbouring: str) -> bool:
        return (mechanism, sampling, neighbouring) in self.verifies_for()

    def models(self, sampling: str, neighbouring: str) -> bool:
        """Whether it bounds a composition of events of this sampling and relation for
        some mechanism. DP-FTRL's combinations do not count: its epsilon is one Gaussian
        over its factorisation's sensitivity (privacy/dp/ftrl/), never a composition of
        sampled events, so declaring it must not open fixed-size events to PLD."""
        return any(
            s == sampling and n == neighbouring
            for m, s, n in self.verifies_for()
            if m in SAMPLED_MECHANISMS
        )


_REGISTRY: dict[str, type[Accountant]] = {}
A = TypeVar("A", bound=type[Accountant])


def register_accountant(cls: A) -> A:
    """Register an Accountant class under its `name` (a class decorator; the name must be
    new). Its `sound_for` lists what the rule table's SOUND rows list for it
    (tests/privacy/dp/test_accountant_registry.py checks both against the validator)."""
    name = cls.name
    if name in _REGISTRY:
        raise ValueError(f"accountant {name!r} is registered already ({_REGISTRY[name]!r})")
    _REGISTRY[name] = cls
    return cls


def create_accountant(name: str) -> Accountant:
    """The registered accountant called `name` (ValueError naming the allowed ones)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"accountant={name!r} is invalid; allowed: {registered_accountants()}")
    return cls()


def registered_accountants() -> tuple[str, ...]:
    """Every registered accountant's name, in registration order."""
    return tuple(_REGISTRY)


_ALL_GAUSSIAN_PAIRS = ((POISSON, ADD_REMOVE), (POISSON, ZERO_OUT))


@register_accountant
class PldAccountant(Accountant):
    """dp-accounting's privacy loss distributions: the tightest for the Gaussian."""

    name = PLD
    # DP-FTRL: one Gaussian over its factorisation's sensitivity, unsampled (the ledger
    # carries z over that sensitivity; privacy/dp/ftrl/ftrl_accounting.py).
    sound_for = _combinations(
        GAUSSIAN_MECHANISMS, (*_ALL_GAUSSIAN_PAIRS, (POISSON, REPLACE_ONE))
    ) | _combinations((DP_FTRL,), ((FIXED, ZERO_OUT), (FIXED, REPLACE_ONE)))

    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        return _pld_epsilon(grouped, delta)


@register_accountant
class PrvAccountant(Accountant):
    """Opacus' privacy random variables (add/remove, and zero-out, which composes alike)."""

    name = PRV
    sound_for = _combinations(GAUSSIAN_MECHANISMS, _ALL_GAUSSIAN_PAIRS)

    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        return _opacus_prv_epsilon(grouped, delta)


@register_accountant
class OpacusRdpAccountant(Accountant):
    """Opacus' Renyi DP of the Poisson-subsampled Gaussian."""

    name = RDP
    sound_for = _combinations(GAUSSIAN_MECHANISMS, _ALL_GAUSSIAN_PAIRS)

    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        return _opacus_rdp_epsilon(grouped, delta)


@register_accountant
class DpaRdpAccountant(Accountant):
    """dp-accounting's Renyi DP: the only one for fixed-size sampling without replacement."""

    name = DPA_RDP
    sound_for = _combinations(GAUSSIAN_MECHANISMS, (*_ALL_GAUSSIAN_PAIRS, (FIXED, REPLACE_ONE)))

    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        return _dpa_rdp_epsilon(grouped, delta)


@register_accountant
class SkellamRdpIntegerAccountant(Accountant):
    """The Skellam RDP curve at integer orders, amplified by bounds valid for any
    mechanism: the only accountant sound for distributed DP."""

    name = SKELLAM_RDP_INTEGER
    sound_for = _combinations(
        (DISTRIBUTED_SKELLAM,),
        ((POISSON, REPLACE_ONE), (POISSON, ZERO_OUT), (FIXED, REPLACE_ONE)),
    )

    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        return _skellam_rdp_epsilon(grouped, delta, self.name)


@register_accountant
class LegacySkellamRdpAccountant(Accountant):
    """The Skellam curve at fractional orders too, where its bound is not proven: sound for
    nothing; old ledgers naming it verify as what they were."""

    name = SKELLAM_RDP
    sound_for: ClassVar[frozenset[Combination]] = frozenset()
    successor = SKELLAM_RDP_INTEGER

    def epsilon(self, grouped: tuple[PrivacyEvent, ...], delta: float) -> float:
        return _skellam_rdp_epsilon(grouped, delta, self.name)
