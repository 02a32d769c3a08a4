"""The model versions a server answers with, where each comes from, and the traffic split.

A version is given as RUN_DIR (a run's final model), FILE (a safetensors file) or
`name@version` (the registry: `name@3`, `name@production`, `name@latest`). A traffic
split serves two (or more) versions under one name, each taking its share of requests
(a canary or an A/B test); metrics are kept per version.

What the model guarantees its training clients comes from the registry's card, or from
the run's privacy ledger (checked): a model with no such statement has no DP guarantee,
and a served model answers membership-inference queries, hence `--public` warns.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from fedveil.server.serving.loading import ModelInfo, load_model_file, load_run_model

log = logging.getLogger("fedveil.serving")

NO_DP_WARNING = (
    "--public: model {ref} has NO differential-privacy guarantee, and anyone can query "
    "it: a served model answers membership-inference queries about the people whose data "
    "trained it"
)


@dataclass
class ServedVersion:
    """One loaded model version."""

    name: str
    version: str
    model: nn.Module
    info: ModelInfo
    source: str  # what the operator named: a path or name@version
    guarantee: str | None  # the DP guarantee in words; None: no DP guarantee
    from_registry: bool = False  # `source` is a name@version reference, not a path

    def describe(self, share: float) -> dict[str, Any]:
        return {
            "version": self.version,
            "share": share,
            # A registry reference; never a path on the server's disk.
            "source": self.source if self.from_registry else None,
            **self.info.as_dict(),
            "dp_guarantee": self.guarantee,
        }


def load_version(spec: str, *, task: str | None = None, name: str | None = None) -> ServedVersion:
    """Load RUN_DIR, FILE or name@version; `task` for a file without metadata, `name` to
    serve a path under another name (a registry version keeps its own)."""
    path = Path(spec)
    allowed = named_tasks(task)
    if path.is_dir():
        model, info = load_run_model(path, allowed_tasks=allowed)
        label = path.resolve().name
        return ServedVersion(name or label, label, model, info, spec, run_guarantee(path))
    if path.is_file():
        model, info = load_model_file(path, task)
        label = path.stem
        run_dir = path.parent if (path.parent / "config.toml").is_file() else None
        guarantee = run_guarantee(run_dir) if run_dir is not None else None
        return ServedVersion(name or label, label, model, info, spec, guarantee)
    if "/" in spec or spec.endswith(".safetensors"):
        raise FileNotFoundError(f"--model {spec!r}: no such run directory or model file")
    return _registry_version(spec, name, allowed_tasks=allowed)


def named_tasks(task: str | None) -> tuple[str, ...]:
    """The custom task the user named (`--task module:function`), which a run directory
    or registry version naming the same task may load; none otherwise."""
    return (task,) if task is not None and ":" in task else ()


def _registry_version(
    ref: str,
    name: str | None,
    root: Path | None = None,
    *,
    allowed_tasks: Collection[str] = (),
) -> ServedVersion:
    from fedveil.server.registry import Registry, default_registry_root

    mv = Registry(root if root is not None else default_registry_root()).resolve(ref)
    config = None
    if mv.run_dir is not None and (Path(mv.run_dir) / "config.toml").is_file():
        config = Path(mv.run_dir) / "config.toml"  # a custom task's function needs it
    # Loaded from the very bytes hashed against the card (and its guarantee): a file
    # swapped after the check is never read.
    data = mv.checked_model_bytes()
    model, info = load_model_file(
        mv.model_path, config=config, allowed_tasks=allowed_tasks, data=data
    )
    return ServedVersion(
        name or mv.name,
        str(mv.version),
        model,
        info,
        mv.ref,
        card_guarantee(mv.card),
        from_registry=True,
    )


def card_guarantee(card: dict[str, Any]) -> str | None:
    """The DP guarantee a registry card states (composed over its lineage), in words."""
    privacy = card.get("privacy") or {}
    if privacy.get("dp", "none") == "none" or privacy.get("epsilon") is None:
        return None
    described = f"{privacy['dp']}, {privacy.get('accountant') or 'accountant unknown'}"
    lineage = card.get("lineage") or {}
    if lineage:
        # A retrained model: the guarantee composed over its lineage, against observers
        # of the published models (those who query a served model are such observers).
        observers = (lineage.get("composed") or {}).get("observers")
        if observers is None:
            return None  # some run in the lineage gives no guarantee
        return (
            f"({float(observers['epsilon']):.4g}, {float(observers['delta']):.3g})-DP "
            f"composed over its lineage ({described})"
        )
    return f"({float(privacy['epsilon']):.4g}, {float(privacy['delta']):.3g})-DP ({described})"


def run_guarantee(run_dir: Path) -> str | None:
    """The DP guarantee of a run's model, from its verified ledger; None without DP. A
    ledger that fails verification is an error: its guarantee cannot be stated."""
    from fedveil.server.registry.card import privacy_section

    return card_guarantee({"privacy": privacy_section(Path(run_dir).resolve())})


class TrafficSplit:
    """The versions served under one name, with their shares of requests (sum 1)."""

    def __init__(self, versions: list[tuple[ServedVersion, float]]) -> None:
        if not versions:
            raise ValueError("a traffic split needs at least one version")
        names = {v.name for v, _ in versions}
        if len(names) != 1:
            raise ValueError(f"a traffic split serves one name; got {sorted(names)}")
        labels = [v.version for v, _ in versions]
        if len(set(labels)) != len(labels):
            raise ValueError(
                f"versions {labels} of one split must differ (serve files or runs with "
                "different names)"
            )
        first = versions[0][0].info
        for v, share in versions:
            if not 0 <= share <= 1:
                raise ValueError(f"share of {v.source} = {share}: must be in [0, 1]")
            if (v.info.input_shape, v.info.num_classes) != (first.input_shape, first.num_classes):
                raise ValueError(
                    f"{v.source} takes {list(v.info.input_shape)} -> {v.info.num_classes} "
                    f"classes, {versions[0][0].source} {list(first.input_shape)} -> "
                    f"{first.num_classes}: versions of one name must take the same inputs"
                )
        total = sum(s for _, s in versions)
        if abs(total - 1) > 1e-9:
            raise ValueError(f"shares sum to {total:g}; they must sum to 1")
        self.name = versions[0][0].name
        self.versions = versions
        self._rng = random.Random()  # routing needs no secrecy, only independence

    def pick(self) -> ServedVersion:
        u, acc = self._rng.random(), 0.0
        for version, share in self.versions:
            acc += share
            if u < acc:
                return version
        return self.versions[-1][0]


class Split(Protocol):
    """What the API needs of the versions behind one name."""

    name: str

    @property
    def versions(self) -> list[tuple[ServedVersion, float]]: ...

    def pick(self) -> ServedVersion | None: ...


class PromotedVersion:
    """One registry name, serving whichever version is promoted: the registry is read again
    every `recheck_s` in a background thread, and a newly promoted version is loaded there
    and then swapped in (requests never wait for a load). None until one is promoted."""

    def __init__(
        self,
        registry_root: Path,
        name: str,
        *,
        recheck_s: float = 5.0,
        public: bool = False,
        allowed_tasks: Collection[str] = (),
    ) -> None:
        """`allowed_tasks`: the custom tasks a promoted version may load (the coordinator's
        runs.allowed_tasks); a version of another custom task is not served."""
        self.name, self.root, self.recheck_s = name, Path(registry_root), recheck_s
        self.public, self.allowed_tasks = public, tuple(allowed_tasks)
        self._current: ServedVersion | None = None
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._watch, name=f"promoted-{name}", daemon=True)
        self._thread.start()

    @property
    def versions(self) -> list[tuple[ServedVersion, float]]:
        current = self._current
        return [] if current is None else [(current, 1.0)]

    def pick(self) -> ServedVersion | None:
        return self._current

    def refresh(self) -> None:
        """Load the promoted version if it changed; a registry error keeps the old one."""
        from fedveil.server.registry import Registry

        try:
            promoted = Registry(self.root).promoted(self.name)
        except (ValueError, OSError) as exc:
            log.warning(
                "serving %s: registry unreadable (%s); keeping the version served", self.name, exc
            )
            return
        current = self._current
        if promoted is None or (current is not None and current.version == str(promoted.version)):
            return
        try:
            loaded = _registry_version(
                promoted.ref, None, self.root, allowed_tasks=self.allowed_tasks
            )
        except (ValueError, OSError) as exc:
            log.error("serving %s: cannot load %s (%s)", self.name, promoted.ref, exc)
            return
        if self.public and loaded.guarantee is None:
            log.warning("%s", NO_DP_WARNING.format(ref=f"{loaded.name}@{loaded.version}"))
        self._current = loaded
        log.warning("serving %s: now version %s", self.name, loaded.version)

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.recheck_s):
            self.refresh()
