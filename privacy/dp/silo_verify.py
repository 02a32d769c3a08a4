"""Verify a secure all-reduce run's per-silo ledgers: each one signed, all of them agreeing.

Contract. With no coordinator, every silo signs its own ledger of what it saw
(client/silo/silo_ledger.py). `verify_silo_ledgers(ledgers, keys)` takes each silo's
ledger (silo id -> file) and the silos' Ed25519 public keys (silo id -> 32 raw bytes:
the roster the silos authenticated one another with) and fails closed, naming the silo
and the field, on:
  - a silo with a key and no ledger, or a ledger and no key (missing, extra);
  - any discrepancy `verify_ledger` finds in one ledger, checked against that silo's
    key only (signatures, chain, run id, rounds, recomputed epsilon, final record);
  - an entry whose `silo` is not the silo it was filed under (swapped ledgers);
  - silos that disagree: a different run id, or, round by round, a silo listed in the
    round's `members` without an entry for it (or one with an entry, not listed), or
    any release field that differs between them (members, attempt, the sum's
    commitment sum_sha256, mechanism, noise multiplier, clip norm, epsilon, ...), or a
    different final record.
Only the fields that are each silo's own by construction are left out of the
comparison: the silo id, its key id and signatures, the chain hashes and timestamps.

What it proves: every silo holding a key in `keys` signed the same account of every
round. Keys pinned in the run directory prove this only against someone who cannot
rewrite the directory; against whoever holds it, pass the keys from the roster the
silos enrolled with (`fedveil privacy verify RUN_DIR --silo-keys ROSTER`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .ledger import RELEASE, entry_kind
from .verify import STATUS_FAILED, STATUS_FINAL, VerifyResult, verify_ledger

# Fields each silo writes for itself: everything else must be the same in every ledger.
OWN_FIELDS = frozenset({"silo", "key_id", "signature", "hash", "prev_hash", "timestamp"})


class SiloDisagreement(Exception):
    """The first discrepancy between, or within, the silos' ledgers."""


def verify_silo_ledgers(
    ledgers: Mapping[int, str | os.PathLike[str]], keys: Mapping[int, bytes]
) -> VerifyResult:
    """Verify every silo's ledger with its own key, then that the silos agree."""
    try:
        entries = _verified_entries(ledgers, keys)
        return _agreement(entries)
    except SiloDisagreement as found:
        return VerifyResult(ok=False, message=str(found), status=STATUS_FAILED)


def _verified_entries(
    ledgers: Mapping[int, str | os.PathLike[str]], keys: Mapping[int, bytes]
) -> dict[int, list[dict[str, Any]]]:
    if not keys:
        raise SiloDisagreement("no silo keys: nothing to verify the silos' ledgers against")
    missing = sorted(set(keys) - set(ledgers))
    if missing:
        raise SiloDisagreement(
            f"silo {missing[0]}: no ledger, but the silo keys list it (silos without a "
            f"ledger: {missing})"
        )
    extra = sorted(set(ledgers) - set(keys))
    if extra:
        raise SiloDisagreement(
            f"silo {extra[0]}: a ledger, but no key for it in the silo keys (extra: {extra})"
        )
    out: dict[int, list[dict[str, Any]]] = {}
    for silo in sorted(ledgers):
        result = verify_ledger(ledgers[silo], public_key=keys[silo])
        if result.status != STATUS_FINAL:
            raise SiloDisagreement(f"silo {silo}: {result.message}")
        with open(ledgers[silo], "rb") as f:
            lines = [json.loads(raw) for raw in f.read().splitlines() if raw.strip()]
        for line, entry in enumerate(lines, 1):
            named = entry.get("silo", "<missing>")
            # Every release names its silo (a closing record may too): it must be this one.
            if (entry_kind(entry) == RELEASE or "silo" in entry) and (
                type(named) is not int or named != silo
            ):
                raise SiloDisagreement(
                    f"silo {silo}: line {line}: silo = {named!r}, but the ledger is filed "
                    f"under silo {silo} (swapped or copied ledger)"
                )
        out[silo] = lines
    return out


def _agreement(entries: dict[int, list[dict[str, Any]]]) -> VerifyResult:
    silos = sorted(entries)
    first = silos[0]
    run_ids = {silo: lines[0].get("run_id") if lines else None for silo, lines in entries.items()}
    for silo in silos:
        if run_ids[silo] != run_ids[first]:
            raise SiloDisagreement(
                f"silo {silo}: run_id = {run_ids[silo]!r}, but silo {first}'s is {run_ids[first]!r}"
            )
    rounds: dict[int, dict[int, dict[str, Any]]] = {}  # round -> silo -> release
    for silo, lines in entries.items():
        for entry in lines:
            if entry_kind(entry) == RELEASE:
                rounds.setdefault(int(entry["round"]), {})[silo] = entry
    for round_num in sorted(rounds):
        seen = rounds[round_num]
        _same_fields(seen, f"round {round_num}")
        members = next(iter(seen.values())).get("members")
        if not isinstance(members, list) or not all(
            isinstance(m, int) and not isinstance(m, bool) for m in members
        ):
            raise SiloDisagreement(f"round {round_num}: members = {members!r}: not silo ids")
        for silo in sorted(set(members) - set(seen)):
            why = "no ledger" if silo not in entries else "no entry for this round"
            raise SiloDisagreement(
                f"silo {silo}: round {round_num}: listed in members {members}, but {why}"
            )
        for silo in sorted(set(seen) - set(members)):
            raise SiloDisagreement(
                f"silo {silo}: round {round_num}: an entry, but not in members {members}"
            )
    closes = {silo: lines[-1] for silo, lines in entries.items() if lines}
    _same_fields(closes, "final record")
    last = closes[first]
    epsilon = last.get("epsilon")
    message = (
        f"{len(silos)} silos' ledgers signed by their keys and in agreement: "
        f"{len(rounds)} rounds, epsilon {epsilon:.6g}"
        if isinstance(epsilon, (int, float))
        else f"{len(silos)} silos' ledgers signed by their keys and in agreement: "
        f"{len(rounds)} rounds"
    )
    return VerifyResult(
        ok=True,
        message=message,
        status=STATUS_FINAL,
        entries=sum(len(lines) for lines in entries.values()),
        final_epsilon=float(epsilon) if isinstance(epsilon, (int, float)) else None,
        run_id=run_ids[first],
        releases=len(rounds),
        training_round=last.get("training_round"),
    )


def _same_fields(seen: Mapping[int, Mapping[str, Any]], where: str) -> None:
    """Every silo's entry has the lowest silo's fields, but for each silo's own."""
    silos = sorted(seen)
    ref_silo = silos[0]
    ref = seen[ref_silo]
    for silo in silos[1:]:
        entry = seen[silo]
        for name in sorted((set(ref) | set(entry)) - OWN_FIELDS):
            if name not in entry or name not in ref or entry[name] != ref[name]:
                raise SiloDisagreement(
                    f"silo {silo}: {where}: {name} = {entry.get(name, '<missing>')!r}, but "
                    f"silo {ref_silo}'s is {ref.get(name, '<missing>')!r}"
                )
