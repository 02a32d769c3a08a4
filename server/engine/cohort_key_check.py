"""Audit a DP run's cohorts and secure-aggregation graphs against the committed key.

The first ledger entry of a DP run carries `cohort_commitment`, SHA-256 over a label
and the secret cohort key. Given the key (from the run's private directory, i.e. the
operator or an auditor holding the admin token), anyone can check afterwards that the
key matches the signed commitment and that every round's recorded cohort and graph
seed followed it: the server could not choose a cohort or graph per round.

What it does not rule out: a server that ground its key before committing to it (it
picks the best of many keys for the whole run), and records the operator wrote about
itself (devices' own records of their sessions would be the independent witness).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fedveil.config import load_config
from fedveil.server.engine.runstore import RunStore
from fedveil.server.engine.sampling import (
    SecretCohortSampler,
    cohort_commitment,
    committed_graph_seed,
)


@dataclass
class CohortAudit:
    ok: bool
    rounds_checked: int
    problems: list[str] = field(default_factory=list)


def audit_cohorts(run_dir: str | Path, key_hex: str | None = None) -> CohortAudit:
    """Check the key against the ledger's commitment and every recorded cohort and graph."""
    run_dir = Path(run_dir)
    store = RunStore(run_dir)
    if key_hex is None:
        identity = run_dir / "private" / "run.json"
        if not identity.exists():
            return CohortAudit(False, 0, [f"{identity}: no cohort key (operator files only)"])
        key_hex = json.loads(identity.read_text())["cohort_key"]
    key = bytes.fromhex(key_hex)
    problems: list[str] = []
    ledger = run_dir / "privacy" / "ledger.jsonl"
    entries = (
        [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    )
    committed = next((e["cohort_commitment"] for e in entries if "cohort_commitment" in e), None)
    if committed is None:
        problems.append("the ledger carries no cohort_commitment (not a secret-cohort DP run?)")
    elif committed != cohort_commitment(key):
        problems.append("the key does not match the ledger's cohort_commitment")
    cfg = load_config(run_dir / "config.toml")
    sampler = SecretCohortSampler(
        cfg.data.num_clients, cfg.server.sampling, cfg.server.per_round, cfg.poisson_rate, key
    )
    rounds = [r for r in store.read_private() if "cohort" in r]
    for record in rounds:
        number = int(record["round"])
        if sorted(record["cohort"]) != sampler.cohort(number):
            problems.append(f"round {number}: the recorded cohort did not follow the key")
        seed = record.get("secagg_graph_seed")
        if seed is not None and bytes.fromhex(seed) != committed_graph_seed(key, number):
            problems.append(f"round {number}: the graph seed did not follow the key")
    return CohortAudit(not problems, len(rounds), problems)
