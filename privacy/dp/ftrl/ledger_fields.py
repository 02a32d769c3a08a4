"""DP-FTRL in the ledger: what a release records, and what `privacy verify` recomputes.

A DP-FTRL release entry is an ordinary release (mechanism 'dp_ftrl', q = 1: no
sampling, z the run's noise multiplier, accountant 'pld') plus an `ftrl` record:

    {"factorization": {...}, "participation": "single" | {...},
     "sensitivity": s, "planned_rounds": T}

The verifier trusts none of the figures: it rebuilds the factorisation and the schema,
RECOMPUTES the sensitivity (a recorded one that differs fails, whoever signed it),
then recomputes epsilon after the entry's release index (its `round`) with
accounting.epsilon_after. The `ftrl` record is run-constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedveil.protocol.dp_rules import DP_FTRL, FIXED, PLD, USER

from .factorizations import Factorization, factorization_from_dict
from .ftrl_accounting import epsilon_after
from .schema import ParticipationSchema

FTRL_FIELD = "ftrl"
SENSITIVITY_REL_TOL = 1e-9


def ftrl_record(factorization: Factorization, schema: ParticipationSchema) -> dict[str, Any]:
    """The run-constant `ftrl` record of every release entry."""
    return {
        "factorization": factorization.to_dict(),
        "participation": schema.to_dict(),
        "sensitivity": factorization.sensitivity(schema),
        "planned_rounds": factorization.rounds,
    }


def ftrl_entry_fields(
    *,
    round_number: int,
    factorization: Factorization,
    schema: ParticipationSchema,
    noise_multiplier: float,
    clip_norm: float,
    neighbouring: str,
    delta: float,
    budget_epsilon: float,
    population_size: int | None,
    epsilon: float,
) -> dict[str, Any]:
    """The ledger fields of DP-FTRL release `round_number` (the ledger adds the rest)."""
    return {
        "round": round_number,
        "mechanism": DP_FTRL,
        "noise_multiplier": float(noise_multiplier),
        "clip_norm": float(clip_norm),
        "sampling_rate": 1.0,
        "sampling": FIXED,  # fixed-size cohorts within the schema; q = 1: no amplification
        "neighbouring": neighbouring,
        "privacy_unit": USER,
        "population_size": population_size,
        "steps": 1,
        "delta": float(delta),
        "epsilon": float(epsilon),
        "accountant": PLD,
        "budget_epsilon": float(budget_epsilon),
        FTRL_FIELD: ftrl_record(factorization, schema),
    }


def parse_ftrl_record(record: object) -> tuple[Factorization, ParticipationSchema, float]:
    """(factorisation, schema, recorded sensitivity) of a recorded `ftrl` field; a
    missing or malformed part raises ValueError naming it."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{FTRL_FIELD}={record!r} is missing or not a record")
    for name in ("factorization", "participation", "sensitivity", "planned_rounds"):
        if name not in record:
            raise ValueError(f"{FTRL_FIELD}.{name} is missing")
    factorization_data = record["factorization"]
    if not isinstance(factorization_data, Mapping):
        raise ValueError(f"{FTRL_FIELD}.factorization={factorization_data!r} is not a record")
    factorization = factorization_from_dict(factorization_data)
    schema = ParticipationSchema.from_config(record["participation"])
    if record["planned_rounds"] != factorization.rounds:
        raise ValueError(
            f"{FTRL_FIELD}.planned_rounds={record['planned_rounds']!r} differs from the "
            f"factorisation's T={factorization.rounds}"
        )
    sensitivity = record["sensitivity"]
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, int | float):
        raise ValueError(f"{FTRL_FIELD}.sensitivity={sensitivity!r} is not a number")
    return factorization, schema, float(sensitivity)


def recompute_ftrl_epsilon(entry: Mapping[str, Any]) -> float:
    """Epsilon after this release, from the recomputed sensitivity; ValueError on any
    discrepancy (the recorded sensitivity included), naming field, value and limit."""
    factorization, schema, recorded = parse_ftrl_record(entry.get(FTRL_FIELD))
    recomputed = factorization.sensitivity(schema)
    if not (abs(recorded - recomputed) <= SENSITIVITY_REL_TOL * recomputed):
        raise ValueError(
            f"recorded {FTRL_FIELD}.sensitivity {recorded!r} differs from the sensitivity "
            f"recomputed from the factorisation ({factorization.kind}, T={factorization.rounds}) "
            f"and {schema.describe()}: {recomputed!r}"
        )
    index = entry.get("round")
    if not (isinstance(index, int) and 1 <= index <= factorization.rounds):
        raise ValueError(
            f"round={index!r} is invalid for DP-FTRL; allowed: [1, planned T="
            f"{factorization.rounds}] (extending T is refused)"
        )
    z = entry.get("noise_multiplier")
    if isinstance(z, bool) or not isinstance(z, int | float) or not math.isfinite(z):
        raise ValueError(f"noise_multiplier={z!r} is not a finite number")
    return epsilon_after(
        factorization, schema, float(z), index, float(entry["delta"]), entry["neighbouring"]
    )


GUARANTEE_NEEDS = (
    "DP-FTRL ({kind} factorisation, sensitivity {sensitivity:.4g}): the epsilon against "
    "observers of the published models holds if no client took part more often, or "
    "closer together, than the participation schema allows ({schema}) over the planned "
    "{rounds} rounds, and if the server's noise state stayed secret. It does not rest on "
    "secret or uniform cohorts: no amplification by sampling is claimed. The coordinator "
    "sees each round's un-noised sum: it is a trusted curator, and no epsilon holds "
    "against it."
)


def guarantee_statement(record: object) -> str:
    """In words, what a DP-FTRL run's epsilon needs (from its ledger's `ftrl` record)."""
    factorization, schema, sensitivity = parse_ftrl_record(record)
    return GUARANTEE_NEEDS.format(
        kind=factorization.kind,
        sensitivity=sensitivity,
        schema=schema.describe(),
        rounds=factorization.rounds,
    )
