"""The coordinator's moving parts and their lifecycle: `Service` (what the API handlers
act on: the SuperLink, the run manager, client registry, drift monitor, counters) and
its owner-only, locked state directory.

`fedveil server` (launch.py) builds one and serves the API over it; the API and its
routers only read its type, so this module imports neither.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from fedveil.config import ConfigError
from fedveil.ops.dir_lock import hold_lock
from fedveil.server.coordinator.auth import load_admin_token
from fedveil.server.coordinator.clients import ClientRegistry
from fedveil.server.coordinator.drift import DriftMonitor
from fedveil.server.coordinator.metrics import RoundsCache, ServiceCounters
from fedveil.server.coordinator.round_index import RoundIndex
from fedveil.server.coordinator.runs import RunManager
from fedveil.server.coordinator.settings import ServerSettings
from fedveil.server.coordinator.superlink import LinkControl, SuperLinkProcess

log = logging.getLogger("fedveil.service")


def secure_state_dir(state_dir: Path) -> None:
    """Owner-only state: umask 077 from here on, the dir 0700, what exists already 0600.

    The state dir holds superlink.db (node keys, in-flight messages, the live
    ServerApp token), logs, run configs, ledgers and metrics: no other local user
    may read any of it. The umask is inherited by the SuperLink and its children.
    Files keep their owner's execute bit (the SuperExec shim in bin/).
    """
    os.umask(0o077)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    for root, dirs, files in os.walk(state_dir):
        for name in dirs + files:
            path = os.path.join(root, name)
            if not os.path.islink(path):  # a link's target may lie outside the state dir
                os.chmod(path, 0o700 if name in dirs else os.stat(path).st_mode & 0o700)


def lock_state_dir(state_dir: Path) -> int:
    """One coordinator per state dir (the lock goes with the process, even on SIGKILL)."""
    secure_state_dir(state_dir)
    fd = hold_lock(state_dir / "server.lock")
    if fd is None:
        raise ConfigError(
            f"state_dir {state_dir}: another fedveil server is using it; stop that server "
            "first (SIGTERM; its runs resume on the next start), or give this one another "
            "--state-dir"
        )
    return fd


class Service:
    """The coordinator's moving parts and their lifecycle (used by the API handlers)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._state_lock = lock_state_dir(settings.state_dir)
        self.counters = ServiceCounters()
        self.rounds_cache = RoundsCache()
        # Round records by round number (GET /runs/{id}/rounds pages): the engine's
        # metrics.jsonl, and the private annex without its charge records.
        self.public_rounds = RoundIndex()
        self.private_rounds = RoundIndex(keep=lambda record: record.get("kind") != "charge")
        self.token = load_admin_token(settings)
        self.registry = ClientRegistry(settings.state_dir)
        self.superlink = SuperLinkProcess(settings)
        self.link: Any = None
        self.manager: RunManager = RunManager(
            settings, None, lambda path: self.rounds_cache.figures(path).rounds
        )
        self.drift = DriftMonitor(
            settings.drift, settings.state_dir, self.manager, connected=self.clients_connected
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nodes: tuple[float, list[Any]] = (0.0, [])
        self._nodes_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self.superlink.start()
        self.link = LinkControl(self.settings)
        self.manager.link = self.link
        resumed = self.manager.resume_interrupted()
        if resumed:
            log.warning(
                "resuming %d run(s) interrupted by the last shutdown: %s",
                len(resumed),
                ", ".join(resumed),
            )
        self._thread = threading.Thread(target=self._supervise, name="fedveil-runs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.link is not None:
            self.link.close()  # no keep-alive connection holds up the SuperLink's shutdown
        self.superlink.stop()
        log.info("coordinator stopped")

    def _supervise(self) -> None:
        while not self._stop.wait(1.0):
            try:
                if not self.superlink.alive():
                    log.error("the SuperLink exited; restarting it and resuming active runs")
                    self.superlink.stop()
                    self.superlink.start()
                    self.manager.resume_interrupted()
                self.manager.reconcile()
                self.drift.tick()  # after reconcile: it sees the drift run's final status
            except Exception:  # the supervisor must outlive any one bad pass
                log.exception("run supervision pass failed; retrying")

    # -- state for the API ----------------------------------------------------
    def superlink_up(self) -> bool:
        return self.superlink.alive()

    def _node_list(self) -> list[Any] | None:
        with self._nodes_lock:
            when, nodes = self._nodes
            if time.monotonic() - when < 2.0:
                return nodes
            try:
                nodes = self.link.nodes() if self.link is not None else []
            except Exception as exc:
                log.debug("listing nodes: %s", exc)
                return None
            self._nodes = (time.monotonic(), nodes)
            return nodes

    def online_nodes(self) -> set[int]:
        return {n.node_id for n in (self._node_list() or []) if n.status == "online"}

    def clients_connected(self) -> int | None:
        """Online nodes mapped to an enrolled client id (with client auth off, where no
        registry maps nodes, every online node)."""
        nodes = self._node_list()
        if nodes is None:
            return None
        online = {n.node_id for n in nodes if n.status == "online"}
        return self.registry.connected(online) if self.settings.client_auth else len(online)

    def nodes_unmapped(self) -> int | None:
        """Online nodes that are not connected clients (refused or unknown)."""
        nodes, connected = self._node_list(), self.clients_connected()
        if nodes is None or connected is None:
            return None
        return sum(n.status == "online" for n in nodes) - connected

    def readiness_problems(self) -> list[str]:
        problems = []
        if not self.superlink_up():
            problems.append("SuperLink is not running")
        elif self._node_list() is None:
            problems.append("SuperLink Control API does not answer")
        if self._thread is None or not self._thread.is_alive():
            problems.append("run supervisor is not running")
        elif time.time() - self.manager.last_reconcile > 30:
            problems.append("run supervisor has not completed a pass in 30 s")
        return problems
