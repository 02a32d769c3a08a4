"""A version's model card: what the model is, how well it does on the server's own test set,
and the privacy guarantee it carries against each adversary, bound to the signed ledger.

What a card may say follows the trust model (docs/explanation/trust-model.md): under DP,
counts and statistics of clients' data (federated accuracy, client and cohort counts, the
partition, example counts) reveal participation and are not released under the
accounting, so a DP run's card carries none of them; only central evaluation on the
server's own test set, the run's public parameters and the accounted figures. A run
without DP has no guarantee to protect, so its card shows the clients' statistics and says
plainly that it has no DP guarantee.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fedveil.privacy.dp.adversaries import coordinator_figure
from fedveil.privacy.dp.ledger import RELEASE, entry_kind, parse_ledger_bytes
from fedveil.privacy.dp.verify import STATUS_FAILED, VerifyResult
from fedveil.server.engine.privacy_report import (
    cohort_source,
    ledger_path,
    secure_aggregation_mode,
    verify_run,
)
from fedveil.server.engine.published_figures import bound_model_sha256
from fedveil.server.registry.store import RegistryError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CARD_SCHEMA = "fedveil.model_card/1"
NO_DP_STATEMENT = (
    "No differential privacy: this model carries no guarantee for the clients whose data "
    "trained it; served, it answers membership-inference queries unprotected."
)
DP_SGD_STATEMENT = (
    "DP-SGD on the clients: each client's example-level epsilon is accounted on the client "
    "from what it trained (its own example count), capped there (--max-dp-epsilon), and "
    "never sent; the coordinator states no epsilon for it, and no user-level guarantee."
)
CLIENT_DATA_WITHHELD = (
    "Withheld under DP: federated accuracy, client and cohort counts, the partition and "
    "example counts are computed from clients' data or reveal participation, and none was "
    "released under the accounting (README 'Trust model')."
)
# Basic composition: valid for any mechanisms, adaptively chosen (Dwork, Rothblum, Vadhan).
SEQUENTIAL_RULE = (
    "sequential (basic) composition: the epsilons and the deltas of every run in the lineage "
    "add up; sound for any mechanisms, since each run's users may have taken part in all"
)
PARALLEL_RULE = (
    "disjoint users (declared at registration): a user took part in one run only, and the "
    "later runs are post-processing of the earlier models for them, so the figure is the "
    "largest epsilon and the largest delta of the lineage"
)


def build_card(
    run_dir: Path, meta: dict[str, str], model_round: int, model_sha256: str
) -> dict[str, Any]:
    """The card of `run_dir`'s model of `model_round` (no name, version or lineage yet:
    the registry adds those). Under DP the ledger must verify (final or interrupted)."""
    run_dir = Path(run_dir).resolve()
    summary = _json(run_dir / "summary.json")
    config = _toml(run_dir / "config.toml")
    metrics = _metrics_of_round(run_dir, model_round)
    privacy = privacy_section(run_dir)
    _check_bound_model(run_dir, privacy, model_round, model_sha256)
    dp = privacy["dp"] != "none"
    card: dict[str, Any] = {
        "schema": CARD_SCHEMA,
        "task": str(meta.get("task") or summary.get("task") or "unknown"),
        "model": str(meta.get("model") or meta.get("task_ref") or "unknown"),
        "dataset": meta.get("dataset"),
        "input_shape": json.loads(meta["input_shape"]) if "input_shape" in meta else None,
        "num_classes": int(meta["num_classes"]) if "num_classes" in meta else None,
        "fedveil_version": meta.get("fedveil_version"),
        "source": {
            "run_dir": str(run_dir),
            "run_id": privacy.get("ledger", {}).get("run_id"),
            "round": model_round,
            "model_sha256": model_sha256,
        },
        "rounds": model_round,
        "rounds_planned": config.get("server", {}).get("rounds"),
        "central_evaluation": {
            "test_accuracy": metrics.get("test_accuracy"),
            "test_loss": metrics.get("test_loss"),
            "on": "the server's own test set (not client data)",
        },
        "secure_aggregation": secure_aggregation_mode(run_dir) or "off",
        "privacy": privacy,
        "client_data": _client_data(run_dir, summary, config, metrics) if not dp else None,
        "lineage": None,
    }
    if dp:
        card["client_data_statement"] = CLIENT_DATA_WITHHELD
    return card


def _check_bound_model(
    run_dir: Path, privacy: dict[str, Any], model_round: int, model_sha256: str
) -> None:
    """The model registered as of the ledger's closing round must be the file that the
    closing record binds (`model_sha256`), where it binds one."""
    ledger = privacy.get("ledger") or {}
    bound = ledger.get("model_sha256")
    if bound is None or model_round != ledger.get("training_round"):
        return  # nothing bound, or an earlier round's model (from the checkpoint)
    if model_sha256 != bound:
        raise RegistryError(
            f"{run_dir}: the model to register (round {model_round}) has sha256 "
            f"{model_sha256}, but the ledger's closing record binds model_sha256 {bound}; "
            "register the model the run published"
        )


def privacy_section(run_dir: Path, result: VerifyResult | None = None) -> dict[str, Any]:
    """What the run's privacy files state, checked: no ledger means no DP; a ledger that
    fails verification is refused. `result`: the ledger's verification, if already run."""
    path = ledger_path(run_dir)
    config_dp = _toml(run_dir / "config.toml").get("dp", {})
    if not path.exists():
        mechanism = config_dp.get("mechanism", "none") if isinstance(config_dp, dict) else "none"
        if mechanism not in (None, "none"):
            raise RegistryError(
                f"{run_dir}: config.toml sets dp.mechanism = {mechanism!r} but the run has no "
                f"privacy ledger ({path}); its guarantee cannot be stated"
            )
        return {"dp": "none", "epsilon": None, "delta": None, "statement": NO_DP_STATEMENT}
    result = result if result is not None else verify_run(run_dir)
    if result.status == STATUS_FAILED:
        raise RegistryError(f"{run_dir}: the privacy ledger fails verification: {result.message}")
    entries, _ = parse_ledger_bytes(path.read_bytes())
    releases = [e for e in entries if entry_kind(e) == RELEASE]
    if not releases:
        plan = (entries[0].get("plan") or {}) if entries else {}
        if plan.get("mechanism") in (None, "none") and float(plan.get("dp_sgd_noise") or 0) > 0:
            return _dp_sgd_section(result, entries, plan)
        raise RegistryError(f"{path}: no release entry; nothing was trained under DP")
    last = releases[-1]
    delta = float(last["delta"])
    report = _json(path.parent / "report.json")
    adversaries = _with_ledger_figures(
        report.get("adversaries") or {}, _adversaries_from_ledger(last, releases, delta)
    )
    return {
        "dp": str(last["mechanism"]),
        "epsilon": float(last["epsilon"]),  # the observers': amplified, cohorts secret
        "delta": delta,
        "accountant": last.get("accountant"),
        "neighbouring": last.get("neighbouring"),
        "privacy_unit": last.get("privacy_unit"),
        "sampling": last.get("sampling"),
        "cohort_source": cohort_source(run_dir),
        "budget_against": last.get("budget_against", "observers"),
        "adversaries": _public_adversaries(adversaries),
        "ledger": {
            "state": result.status,
            "run_id": result.run_id,
            "key_id": result.key_id,
            "entries": len(entries),
            "releases": len(releases),
            "head_hash": entries[-1]["hash"],
            "head_signature": entries[-1].get("signature"),
            **_bound_model(entries),
        },
    }


def _bound_model(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The closing record's round and the model hash it binds, where it binds one."""
    bound = bound_model_sha256(entries)
    if bound is None:
        return {}
    return {"model_sha256": bound, "training_round": entries[-1].get("training_round")}


def _dp_sgd_section(
    result: VerifyResult, entries: list[dict[str, Any]], plan: dict[str, Any]
) -> dict[str, Any]:
    """A DP-SGD-only run (issue 28): its ledger opens and closes with no release; the
    guarantee is each device's example-level epsilon, accounted on the device, which the
    coordinator never learns, so the card states the noise, not an epsilon."""
    return {
        "dp": "dp_sgd",
        "epsilon": None,
        "delta": None,
        "noise_multiplier": plan.get("dp_sgd_noise"),
        "clip_norm": plan.get("dp_sgd_clip"),
        "statement": DP_SGD_STATEMENT,
        "ledger": {
            "state": result.status,
            "run_id": result.run_id,
            "key_id": result.key_id,
            "entries": len(entries),
            "releases": 0,
            "head_hash": entries[-1]["hash"],
            "head_signature": entries[-1].get("signature"),
            **_bound_model(entries),
        },
    }


def compose_lineage(
    own: dict[str, Any],
    parent_card: dict[str, Any],
    parent_ref: str,
    same_users: bool,
    evaluations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card's `lineage`: its parent and, per adversary, epsilon and delta composed
    over the parent's own composed figures, the drift evaluations of the parent that led to
    this run (`evaluations`, drift_evaluations.py; None: none) and this run's. A run without
    DP anywhere in the lineage leaves nothing to compose (None, with the reason)."""
    parent_composed = (parent_card.get("lineage") or {}).get("composed") or _own_figures(
        parent_card
    )
    mine = _own_figures(own)
    steps = [parent_composed, *([_evaluation_figures(evaluations)] if evaluations else []), mine]
    composed: dict[str, Any] = {}
    for adversary in ("observers", "coordinator"):
        parts = [step.get(adversary) for step in steps]
        if any(p is None or p.get("epsilon") is None for p in parts):
            composed[adversary] = None  # no guarantee somewhere in the lineage: none composed
            continue
        combine = sum if same_users else max
        composed[adversary] = {
            "epsilon": combine(float(p["epsilon"]) for p in parts),
            "delta": combine(float(p["delta"]) for p in parts),
        }
    lineage = [*((parent_card.get("lineage") or {}).get("chain") or []), parent_ref]
    return {
        "parent": parent_ref,
        "parent_model_sha256": parent_card.get("source", {}).get("model_sha256"),
        "chain": lineage,
        "same_users": same_users,
        "rule": SEQUENTIAL_RULE if same_users else PARALLEL_RULE,
        **({"drift_evaluations": evaluations} if evaluations is not None else {}),
        "composed": composed,
        "composed_statement": (
            "None for an adversary means that some run in the lineage gives no guarantee "
            "against it (no DP, or a trusted curator), so neither does this model."
        ),
    }


def _evaluation_figures(evaluations: dict[str, Any]) -> dict[str, dict[str, float] | None]:
    """The drift evaluations' (epsilon, delta) per adversary: central noise, so none holds
    against the coordinator once anything was released."""
    figures = {"epsilon": float(evaluations["epsilon"]), "delta": float(evaluations["delta"])}
    return {
        "observers": figures,
        "coordinator": figures if not evaluations.get("releases") else None,
    }


def unknown_lineage(init_model_sha256: str) -> dict[str, Any]:
    """The lineage of a run that started from a model outside the registry: what it
    cost is unknown here, so no composed figure is stated (none is claimed)."""
    return {
        "parent": None,
        "init_model_sha256": init_model_sha256,
        "chain": [],
        "same_users": None,
        "rule": None,
        "composed": {"observers": None, "coordinator": None},
        "composed_statement": (
            "The run started from a model that is not in this registry (lineage.json): "
            "its privacy cost is unknown here, so this model carries no composed guarantee."
        ),
    }


def _own_figures(card: dict[str, Any]) -> dict[str, dict[str, float] | None]:
    """This card's own (epsilon, delta) against the observers and the coordinator; None
    where there is no guarantee (no DP; a trusted curator)."""
    privacy = card.get("privacy") or {}
    if privacy.get("dp", "none") == "none":
        return {"observers": None, "coordinator": None}
    adversaries = privacy.get("adversaries") or {}
    coordinator = adversaries.get("coordinator") or {}
    bound = coordinator.get("epsilon_bound", coordinator.get("epsilon"))
    return {
        "observers": {"epsilon": privacy["epsilon"], "delta": privacy["delta"]},
        "coordinator": None
        if bound is None
        else {"epsilon": float(bound), "delta": float(coordinator.get("delta", privacy["delta"]))},
    }


def _with_ledger_figures(stated: dict[str, Any], from_ledger: dict[str, Any]) -> dict[str, Any]:
    """The report's words per adversary, with every figure taken from the verified ledger
    (a stale or edited report.json cannot lower a card's epsilon)."""
    out = json.loads(json.dumps(stated))
    for adversary, figures in from_ledger.items():
        mine = out.setdefault(adversary, {})
        if not isinstance(mine, dict):
            out[adversary] = mine = {}
        for key in ("epsilon", "epsilon_bound", "delta", "accountant"):
            if key in figures:
                mine[key] = figures[key]
            else:
                mine.pop(key, None)
    return out


def _public_adversaries(adversaries: dict[str, Any]) -> dict[str, Any]:
    """The public report's figures per adversary; never the operator's realised ones."""
    out = json.loads(json.dumps(adversaries))
    coordinator = out.get("coordinator")
    if isinstance(coordinator, dict):
        for private in ("epsilon_max", "distribution", "source", "clients"):
            coordinator.pop(private, None)
    return out


def _adversaries_from_ledger(
    last: dict[str, Any], releases: list[dict[str, Any]], delta: float
) -> dict[str, Any]:
    """Without report.json (an interrupted run): the figures the report would state."""
    return {
        "observers": {
            "epsilon": float(last["epsilon"]),
            "delta": delta,
            "accountant": last.get("accountant"),
            "amplified_by_sampling": last.get("sampling") != "none",
        },
        "coordinator": coordinator_figure(str(last["mechanism"]), releases, delta),
    }


def _client_data(
    run_dir: Path, summary: dict[str, Any], config: dict[str, Any], metrics: dict[str, Any]
) -> dict[str, Any]:
    """Statistics of clients' data: for runs without DP only."""
    data = config.get("data", {})
    partition = _json(run_dir / "partition.json")
    return {
        "federated_accuracy": metrics.get("federated_accuracy"),
        "federated_loss": metrics.get("federated_loss"),
        "clients": summary.get("clients"),
        "per_round": summary.get("per_round"),
        "partition": data.get("partition"),
        "alpha": data.get("alpha"),
        "examples": partition.get("num_samples"),
        "partition_summary": partition.get("summary"),
    }


def _metrics_of_round(run_dir: Path, round_num: int) -> dict[str, Any]:
    path = run_dir / "metrics.jsonl"
    found: dict[str, Any] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("round") == round_num:
            found = record
    return found


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
