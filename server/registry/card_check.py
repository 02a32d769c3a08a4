"""Check a model card against its run's ledger: every privacy figure a card states must be
what the verified, signed ledger gives, so a card cannot claim a smaller epsilon, another
ledger head or a DP run's client statistics. Used by `fedveil privacy verify --card`."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.privacy.dp.verify import STATUS_FAILED, VerifyResult
from fedveil.server.engine.privacy_report import secure_aggregation_mode
from fedveil.server.registry.card import compose_lineage, privacy_section
from fedveil.server.registry.drift_evaluations import DRIFT_EVALUATIONS_FILE, drift_evaluations
from fedveil.server.registry.lineage import LINEAGE_FILE, read_lineage
from fedveil.server.registry.store import RegistryError

# Every field of a card's privacy section that the ledger decides.
CHECKED_FIELDS = (
    "dp",
    "epsilon",
    "delta",
    "accountant",
    "neighbouring",
    "sampling",
    "adversaries.observers.epsilon",
    "adversaries.observers.delta",
    "adversaries.observers.accountant",
    "adversaries.coordinator.epsilon",
    "adversaries.coordinator.epsilon_bound",
    "adversaries.coordinator.delta",
    "ledger.state",
    "ledger.run_id",
    "ledger.key_id",
    "ledger.entries",
    "ledger.releases",
    "ledger.head_hash",
)
_MISSING = object()


@dataclass
class CardCheck:
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, name: str, message: str) -> None:
        self.problems.append(f"card field {name}: {message}")


def check_card(
    card: dict[str, Any],
    run_dir: Path | None = None,
    *,
    result: VerifyResult | None = None,
    parent_card: dict[str, Any] | None = None,
    model_path: Path | None = None,
) -> CardCheck:
    """Problems found comparing `card` with its run (`run_dir`, default the card's
    source.run_dir). `result`: the run's ledger verification, if already done;
    `parent_card`: the parent version's card, to recompute the composed lineage;
    `model_path`: the model file the card describes (its SHA-256 is compared)."""
    check = CardCheck()
    source = card.get("source") or {}
    run_dir = Path(run_dir or source.get("run_dir") or "")
    if not run_dir.is_dir():
        check.fail("source.run_dir", f"{str(run_dir)!r} is not a run directory")
        return check
    if result is not None and result.status == STATUS_FAILED:
        check.fail("privacy.ledger", f"the run's ledger fails verification: {result.message}")
        return check
    try:
        expected = privacy_section(run_dir, result)
    except RegistryError as error:
        check.fail("privacy", str(error))
        return check
    stated = card.get("privacy") or {}
    for name in CHECKED_FIELDS:
        want, got = _get(expected, name), _get(stated, name)
        if not _same(want, got):
            check.fail(f"privacy.{name}", f"the card states {_show(got)}, the ledger {_show(want)}")
    if expected["dp"] != "none" and card.get("client_data") is not None:
        check.fail(
            "client_data",
            "a DP run's card carries clients' statistics, which were not released under the "
            "accounting",
        )
    mode = secure_aggregation_mode(run_dir) or "off"
    if card.get("secure_aggregation") != mode:
        check.fail(
            "secure_aggregation",
            f"the card states {_show(card.get('secure_aggregation'))}, config.toml {mode!r}",
        )
    if model_path is not None:
        digest = hashlib.sha256(Path(model_path).read_bytes()).hexdigest()
        if digest != source.get("model_sha256"):
            check.fail("source.model_sha256", f"{model_path} hashes to {digest}")
    _check_lineage(card, parent_card, run_dir, check)
    return check


def _check_lineage(
    card: dict[str, Any], parent_card: dict[str, Any] | None, run_dir: Path, check: CardCheck
) -> None:
    lineage = card.get("lineage")
    recorded = read_lineage(run_dir)
    if recorded is not None and not lineage:
        check.fail(
            "lineage",
            f"the run started from a model ({LINEAGE_FILE}: SHA-256 "
            f"{recorded.get('init_model_sha256')}) but the card states no lineage",
        )
        return
    if not lineage:
        return
    if recorded is not None and lineage.get("parent") is not None and parent_card is not None:
        sha = (parent_card.get("source") or {}).get("model_sha256")
        if sha != recorded.get("init_model_sha256"):
            check.fail(
                "lineage.parent",
                f"{lineage.get('parent')!r} is not the model the run started from "
                f"({LINEAGE_FILE}: {recorded.get('init_model_sha256')})",
            )
    if lineage.get("parent") is None:  # a starting model outside the registry
        if any(v is not None for v in (lineage.get("composed") or {}).values()):
            check.fail(
                "lineage.composed",
                "the run started from a model outside the registry, whose cost is unknown; "
                "the card may state no composed figure",
            )
        return
    if parent_card is None:
        check.fail(
            "lineage.parent",
            f"{lineage.get('parent')!r} was not found; the composed epsilon cannot be checked",
        )
        return
    parent = str(lineage.get("parent"))
    try:
        evaluations = drift_evaluations(run_dir, parent)
    except RegistryError as error:
        check.fail("lineage.drift_evaluations", str(error))
        return
    want = compose_lineage(
        card, parent_card, parent, bool(lineage.get("same_users", True)), evaluations
    )
    for key in ("releases", "epsilon", "delta"):
        name = f"drift_evaluations.{key}"
        expected, got = _get(want, name), _get(lineage, name)
        if not _same(expected, got):
            check.fail(
                f"lineage.{name}",
                f"the card states {_show(got)}, the run's {DRIFT_EVALUATIONS_FILE} gives "
                f"{_show(expected)}",
            )
    for adversary in ("observers", "coordinator"):
        for key in ("epsilon", "delta"):
            name = f"composed.{adversary}.{key}"
            expected, got = _get(want, name), _get(lineage, name)
            if not _same(expected, got):
                check.fail(
                    f"lineage.{name}",
                    f"the card states {_show(got)}, composing the lineage gives {_show(expected)}",
                )


def _get(values: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if values is None:
            return None  # a null section (e.g. no coordinator figure): every field absent
        if not isinstance(values, dict) or key not in values:
            return _MISSING
        values = values[key]
    return values


def _same(want: Any, got: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(float(want), float(got), rel_tol=1e-9, abs_tol=1e-12)
    return want == got


def _show(value: Any) -> str:
    return "nothing" if value is _MISSING else repr(value)
