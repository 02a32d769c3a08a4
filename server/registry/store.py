"""The registry's files: named models, numbered versions, one promoted version per name.

Layout under the root (each file written atomically; a reader sees old or new, never half):
  index.json                      every name, its versions and its promoted one
  .lock                           held (fcntl) while a writer reads, changes and rewrites
  <name>/v<N>/model.safetensors   the registry's own copy: the run may move or be deleted
  <name>/v<N>/card.json           the version's model card (card.py)

Everything is private to the registry's owner, as a run's own files are: files 600,
directories 700, whatever the umask (a model may be trained on private data; its card
names the run and its ledger).

Writers from several processes (the coordinator and an operator's CLI) serialise on the
lock, so two registrations never take the same version number nor lose one another.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedveil.server.engine.runstore import atomic_write_bytes

REGISTRY_ENV = "FEDVEIL_REGISTRY"
INDEX_SCHEMA = "fedveil.registry/1"
MODEL_FILE = "model.safetensors"
PRIVATE_FILE = 0o600  # as the run's own model.safetensors
PRIVATE_DIR = 0o700
CARD_FILE = "card.json"
PRODUCTION = "production"  # the stage of a name's promoted version
REGISTERED = "registered"  # every other version's
LATEST = "latest"
# fullmatch, never match with `$`: `$` also matches before a trailing newline.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class RegistryError(ValueError):
    """A bad name, version or reference, or a run that cannot be registered."""


def default_registry_root() -> Path:
    """$FEDVEIL_REGISTRY, else $XDG_DATA_HOME/fedveil/registry, else
    ~/.local/share/fedveil/registry (beside the ledger key store)."""
    configured = os.environ.get(REGISTRY_ENV)
    if configured:
        return Path(configured)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "fedveil" / "registry"


def check_name(name: str) -> str:
    """A model name: lower-case letters, digits, '.', '_' and '-', 1 to 64 characters."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise RegistryError(
            f"model name {name!r}: use 1 to 64 of a-z, 0-9, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def name_from(text: str) -> str:
    """A valid model name derived from a task name ('Tiny Blobs' -> 'tiny-blobs')."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64]
    return slug or "model"


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: int
    model_path: Path
    run_dir: Path | None
    task: str
    model: str
    card: dict[str, Any]
    stage: str

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def checked_model_bytes(self) -> bytes:
        """The version's model file's bytes, once they hash to its card's
        `source.model_sha256`; RegistryError otherwise. The card binds the ledger's
        guarantee to these bytes: load from them (a file swapped after the check is
        never read), and a file changed after registration is not served under it."""
        stated = (self.card.get("source") or {}).get("model_sha256")
        if not (isinstance(stated, str) and re.fullmatch(r"[0-9a-f]{64}", stated)):
            raise RegistryError(f"{self.ref}: its card states no source.model_sha256")
        data = Path(self.model_path).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != stated:
            raise RegistryError(
                f"{self.ref}: {self.model_path} hashes to {digest}, its card's "
                f"source.model_sha256 is {stated}: the file changed after registration"
            )
        return data

    def checked_model_path(self) -> Path:
        """The version's model file, once it hashes to its card's `source.model_sha256`
        (checked_model_bytes); for a reader in another process. In this process, load
        from checked_model_bytes: the file is read once."""
        self.checked_model_bytes()
        return self.model_path


def _private_dir(path: Path) -> None:
    """`path` (and missing parents) as a directory only its owner can enter: 700."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_DIR)


class RegistryFiles:
    """The index and version directories under `root`, and the writers' lock."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def index_path(self) -> Path:
        return self.root / "index.json"

    def version_dir(self, name: str, version: int) -> Path:
        return self.root / check_name(name) / f"v{version}"

    @contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The index, under the exclusive lock; what the block leaves in it is written back."""
        self.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)  # an existing root is kept
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            index = self.read_index()
            before = json.dumps(index, sort_keys=True)
            yield index
            if json.dumps(index, sort_keys=True) != before:
                self.write_index(index)
        finally:
            os.close(fd)  # closing releases the lock

    def read_index(self) -> dict[str, Any]:
        try:
            index = json.loads(self.index_path.read_text())
        except FileNotFoundError:
            return {"schema": INDEX_SCHEMA, "models": {}}
        except ValueError as error:
            raise RegistryError(f"{self.index_path}: not valid JSON ({error})") from None
        schema = index.get("schema") if isinstance(index, dict) else None
        if schema != INDEX_SCHEMA:
            raise RegistryError(f"{self.index_path}: schema {schema!r} is not {INDEX_SCHEMA!r}")
        return index

    def write_index(self, index: dict[str, Any]) -> None:
        data = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
        atomic_write_bytes(self.index_path, data, mode=PRIVATE_FILE)

    def write_version(self, name: str, version: int, model: bytes, card: dict[str, Any]) -> Path:
        """The version's directory with its model copy and card; the model's path."""
        directory = self.version_dir(name, version)
        _private_dir(directory.parent)
        _private_dir(directory)
        atomic_write_bytes(directory / MODEL_FILE, model, mode=PRIVATE_FILE)
        card_bytes = (json.dumps(card, indent=2, sort_keys=True) + "\n").encode()
        atomic_write_bytes(directory / CARD_FILE, card_bytes, mode=PRIVATE_FILE)
        return directory / MODEL_FILE

    def read_card(self, name: str, version: int) -> dict[str, Any]:
        path = self.version_dir(name, version) / CARD_FILE
        try:
            card = json.loads(path.read_text())
        except FileNotFoundError:
            raise RegistryError(f"{name}@{version}: its card {path} is missing") from None
        except ValueError as error:
            raise RegistryError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(card, dict):
            raise RegistryError(f"{path}: not a JSON object")
        return card


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
