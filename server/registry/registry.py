"""Registry: register a run's model as a numbered version, promote one per name, resolve
references ("name@3", "name@production", "name@latest", "name" = the promoted one)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fedveil.privacy.dp.verify import VerifyResult
from fedveil.server.registry.card import build_card, compose_lineage, unknown_lineage
from fedveil.server.registry.card_check import CardCheck, check_card
from fedveil.server.registry.drift_evaluations import drift_evaluations
from fedveil.server.registry.lineage import LINEAGE_FILE, read_lineage
from fedveil.server.registry.run_model import round_model
from fedveil.server.registry.store import (
    LATEST,
    MODEL_FILE,
    PRODUCTION,
    REGISTERED,
    ModelVersion,
    RegistryError,
    RegistryFiles,
    check_name,
    name_from,
    utc_now,
)


class Registry:
    """Versions per model name, stored under `root` (see store.py for the layout)."""

    def __init__(self, root: Path) -> None:
        self.files = RegistryFiles(Path(root))

    @property
    def root(self) -> Path:
        return self.files.root

    def register(
        self,
        run_dir: Path,
        *,
        name: str | None = None,
        round_num: int | None = None,
        parent: str | None = None,
        same_users: bool = True,
    ) -> ModelVersion:
        """Register `run_dir`'s final model (or that of `round_num`, if the run still holds
        it) as the next version of `name` (default: from the task's name).

        `parent`: the reference of the version this run started from; its card then
        composes epsilon over the lineage: summed (`same_users`, the sound default) or,
        when the operator declares the runs' users disjoint, the largest; a run retrained
        on drift adds the parent's drift evaluations it carries (drift_evaluations.py).
        Without it, the run's lineage.json (`fedveil simulate --init-model`) names the
        starting model, found here by its SHA-256; a starting model not in this registry
        leaves no composed figure.
        """
        run_dir = Path(run_dir).resolve()
        if not run_dir.is_dir():
            raise RegistryError(f"run directory {run_dir}: no such directory")
        model, meta, model_round = round_model(run_dir, round_num)
        card = build_card(run_dir, meta, model_round, hashlib.sha256(model).hexdigest())
        name = check_name(name if name is not None else name_from(card["task"]))
        recorded = read_lineage(run_dir)
        parent_version = self._parent(parent, recorded)
        if parent_version is not None:
            card["lineage"] = compose_lineage(
                card,
                parent_version.card,
                parent_version.ref,
                same_users,
                # A retrain on drift counts the parent's evaluations that led to it.
                drift_evaluations(run_dir, parent_version.ref),
            )
        elif recorded is not None:
            card["lineage"] = unknown_lineage(str(recorded.get("init_model_sha256")))
        with self.files.locked() as index:
            entry = index["models"].setdefault(name, {"versions": [], "promoted": None})
            version = max((v["version"] for v in entry["versions"]), default=0) + 1
            card.update(name=name, version=version, registered_at=utc_now())
            self.files.write_version(name, version, model, card)
            entry["versions"].append(
                {
                    "version": version,
                    "registered_at": card["registered_at"],
                    "run_dir": str(run_dir),
                }
            )
        return self.get(name, version)

    def names(self) -> list[str]:
        return sorted(self.files.read_index()["models"])

    def versions(self, name: str) -> list[ModelVersion]:
        entry = self._entry(self.files.read_index(), name)
        return [self._version(name, v["version"], entry) for v in entry["versions"]]

    def get(self, name: str, version: int) -> ModelVersion:
        entry = self._entry(self.files.read_index(), name)
        if not any(v["version"] == version for v in entry["versions"]):
            known = ", ".join(str(v["version"]) for v in entry["versions"]) or "none"
            raise RegistryError(f"{name}@{version}: no such version (versions: {known})")
        return self._version(name, version, entry)

    def promote(self, name: str, version: int) -> None:
        """Make `version` the one `name` and `name@production` resolve to."""
        self.get(name, version)  # names the missing version
        with self.files.locked() as index:
            self._entry(index, name)["promoted"] = version

    def promoted(self, name: str) -> ModelVersion | None:
        entry = self._entry(self.files.read_index(), name)
        version = entry.get("promoted")
        return None if version is None else self._version(name, int(version), entry)

    def resolve(self, ref: str) -> ModelVersion:
        """'name@3', 'name@production', 'name@latest' or 'name' (the promoted version)."""
        name, _, tag = ref.partition("@")
        try:
            check_name(name)
        except RegistryError as error:
            raise RegistryError(f"model reference {ref!r}: {error}") from None
        index = self.files.read_index()
        if name not in index["models"]:
            known = ", ".join(sorted(index["models"])) or "none registered"
            raise RegistryError(f"model reference {ref!r}: no model named {name!r} ({known})")
        entry = index["models"][name]
        if tag in ("", PRODUCTION):
            if entry.get("promoted") is None:
                raise RegistryError(
                    f"model reference {ref!r}: {name} has no promoted version; name one "
                    f"({name}@N) or promote one (fedveil models promote {name} N)"
                )
            return self._version(name, int(entry["promoted"]), entry)
        if tag == LATEST:
            if not entry["versions"]:
                raise RegistryError(f"model reference {ref!r}: {name} has no versions")
            return self._version(name, entry["versions"][-1]["version"], entry)
        number = tag[1:] if tag.startswith("v") else tag
        if not number.isdigit():
            raise RegistryError(
                f"model reference {ref!r}: after '@' expected a version number, "
                f"'{PRODUCTION}' or '{LATEST}', got {tag!r}"
            )
        try:
            return self.get(name, int(number))
        except RegistryError as error:
            raise RegistryError(f"model reference {ref!r}: {error}") from None

    def _parent(self, ref: str | None, recorded: dict[str, Any] | None) -> ModelVersion | None:
        """The parent version: `ref` (which must be the model lineage.json recorded, if
        any), else the version whose model the run started from."""
        started = None if recorded is None else recorded.get("init_model_sha256")
        if ref is not None:
            version = self.resolve(ref)
            sha = version.card.get("source", {}).get("model_sha256")
            if started is not None and sha != started:
                raise RegistryError(
                    f"parent {ref!r}: its model (SHA-256 {sha}) is not the one the run started "
                    f"from ({LINEAGE_FILE}: {started})"
                )
            return version
        if started is None:
            return None
        if recorded and recorded.get("parent"):
            try:
                version = self.resolve(str(recorded["parent"]))
            except RegistryError:
                version = None
            if version is not None and version.card["source"].get("model_sha256") == started:
                return version
        for name in self.names():
            for version in self.versions(name):
                if version.card.get("source", {}).get("model_sha256") == started:
                    return version
        return None

    def check(self, version: ModelVersion, result: VerifyResult | None = None) -> CardCheck:
        """`version`'s card against its run's ledger, its model copy and its parent's card."""
        return check_card(
            version.card,
            version.run_dir,
            result=result,
            parent_card=self.parent_card(version.card),
            model_path=version.model_path,
        )

    def parent_card(self, card: dict[str, Any]) -> dict[str, Any] | None:
        """The card of `card`'s parent in this registry (None: no parent, or not here)."""
        parent = (card.get("lineage") or {}).get("parent")
        if not parent:
            return None
        try:
            return self.resolve(str(parent)).card
        except RegistryError:
            return None

    def _entry(self, index: dict[str, Any], name: str) -> dict[str, Any]:
        check_name(name)
        try:
            return index["models"][name]
        except KeyError:
            known = ", ".join(sorted(index["models"])) or "none registered"
            raise RegistryError(f"model {name!r}: not in the registry ({known})") from None

    def _version(self, name: str, version: int, entry: dict[str, Any]) -> ModelVersion:
        card = self.files.read_card(name, version)
        run_dir = card.get("source", {}).get("run_dir")
        return ModelVersion(
            name=name,
            version=version,
            model_path=self.files.version_dir(name, version) / MODEL_FILE,
            run_dir=Path(run_dir) if run_dir else None,
            task=str(card.get("task", "unknown")),
            model=str(card.get("model", "unknown")),
            card=card,
            stage=PRODUCTION if entry.get("promoted") == version else REGISTERED,
        )
