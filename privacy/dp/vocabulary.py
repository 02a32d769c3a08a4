"""The closed vocabularies of the DP layer: mechanisms, units, sampling, relations, accountants.

Plain strings (not Enums) so that they round-trip through JSON ledgers unchanged.
"""

from __future__ import annotations

CENTRAL_GAUSSIAN = "central_gaussian"
DISTRIBUTED_SKELLAM = "distributed_skellam"
DP_SGD = "dp_sgd"
MECHANISMS = (CENTRAL_GAUSSIAN, DISTRIBUTED_SKELLAM, DP_SGD)

USER = "user"
EXAMPLE = "example"
PRIVACY_UNITS = (USER, EXAMPLE)

POISSON = "poisson"
FIXED = "fixed"  # fixed-size sampling without replacement
SAMPLING_SCHEMES = (POISSON, FIXED)

ADD_REMOVE = "add_remove"
REPLACE_ONE = "replace_one"
NEIGHBOURING_RELATIONS = (ADD_REMOVE, REPLACE_ONE)

PLD = "pld"  # Google dp-accounting privacy loss distributions
PRV = "prv"  # Opacus privacy random variables
RDP = "rdp"  # Opacus Renyi DP
DPA_RDP = "dpa_rdp"  # Google dp-accounting Renyi DP (the only one for fixed-size sampling)
AUTO = "auto"
ACCOUNTANTS = (PLD, PRV, RDP, DPA_RDP)

# Which accountants model which (sampling, neighbouring) pair. Opacus only models
# Poisson add/remove; dp-accounting's PLD adds Poisson replace-one; only
# dp-accounting's RDP models fixed-size sampling without replacement (replace-one,
# Wang-Balle-Kasiviswanathan 2019). Fixed-size with add/remove is modelled by none.
SUPPORTED_ACCOUNTANTS: dict[tuple[str, str], tuple[str, ...]] = {
    (POISSON, ADD_REMOVE): (PLD, PRV, RDP, DPA_RDP),
    (POISSON, REPLACE_ONE): (PLD,),
    (FIXED, REPLACE_ONE): (DPA_RDP,),
}


def supported_accountants(sampling: str, neighbouring: str) -> tuple[str, ...]:
    """Accountants able to bound this sampling scheme under this neighbouring relation."""
    return SUPPORTED_ACCOUNTANTS.get((sampling, neighbouring), ())


def default_accountant(mechanism: str, sampling: str, neighbouring: str) -> str:
    """The tightest valid accountant for the combination.

    Distributed Skellam defaults to RDP: its Gaussian equivalence is proven at the
    level of RDP curves (see skellam.py), so RDP is the conservative choice there.
    """
    supported = supported_accountants(sampling, neighbouring)
    if not supported:
        raise ValueError(
            f"no accountant models sampling={sampling!r} with neighbouring={neighbouring!r}; "
            f"supported pairs: {sorted(SUPPORTED_ACCOUNTANTS)}"
        )
    if mechanism == DISTRIBUTED_SKELLAM and RDP in supported:
        return RDP
    return supported[0]
