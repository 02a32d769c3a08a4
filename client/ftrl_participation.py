"""What a client counts of its own DP-FTRL participations, and refuses beyond the schema.

DP-FTRL's epsilon holds for clients that kept to the participation schema of the run
config they accepted (`dp.ftrl_min_separation` b, `dp.ftrl_max_participations` k). The
server's sampler enforces it; the client enforces what it can observe, before it trains:

- at most k participations per run: counted locally, sound. The count is written
  durably BEFORE training (a crash after it counts the participation: conservative),
  on a device under its state directory, so it survives a restart;
- min-separation, clocked by the signed ledger: a DP-FTRL training request carries the
  ledger's head, which the device has already verified (edge/ledger_guard.py: pinned
  key, no rollback, no fork). The release this participation feeds is the head's
  release index + 1 (the ledger's `round` counts releases, and the coordinator cannot
  renumber signed entries); it must be at least b after the index recorded for the
  previous participation. A request without a head, or past the final record, is refused.

What a client cannot check: that the coordinator showed it the LATEST head (a stale
head makes the device record a lower index than the release its update really enters,
so a later participation can be closer than b in releases; the ledger guard bounds the
staleness only by what this device saw before); that other clients keep the schema;
and that the server adds the noise at all (it is a trusted curator). In simulation each
runtime counts in memory the clients it serves, through this same code.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from fedveil.config import RunConfig
from fedveil.privacy.dp.ftrl.ftrl_plan import ftrl_schema
from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY
from fedveil.privacy.dp.ledger_head import parse_head_message
from fedveil.protocol.envelope import Envelope, MessageError


class ParticipationRefusal(MessageError):
    """A DP-FTRL training request beyond what the schema lets this client do."""


class ParticipationGuard:
    """Per (ledger run, client): the release indices this client trained for."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory  # None: in memory (simulation)
        self._memory: dict[tuple[str, int], list[int]] = {}
        self._lock = threading.Lock()

    def admit(self, client_id: int, cfg: RunConfig, msg: Envelope) -> int:
        """Record this participation (durably) and return its release index, or raise
        ParticipationRefusal naming the schema and what breaks it."""
        schema = ftrl_schema(cfg.dp_parameters())
        rounds = cfg.server.rounds
        raw = msg.config.get(WITNESS_CONFIG_KEY)
        if raw is None:
            raise ParticipationRefusal(
                f"{msg.kind} request of a DP-FTRL run carries no {WITNESS_CONFIG_KEY}: this "
                f"client clocks {schema.describe()} by the signed ledger's release index"
            )
        try:
            entry = parse_head_message(raw)["entry"]
        except ValueError as error:
            raise ParticipationRefusal(f"{msg.kind} request refused: {error}") from None
        kind, run_id = entry.get("kind"), entry.get("run_id")
        if kind == "open":
            index = 1
        elif kind == "release" and isinstance(entry.get("round"), int):
            index = int(entry["round"]) + 1
        else:
            raise ParticipationRefusal(
                f"{msg.kind} request refused: the ledger head is a {kind!r} record; a "
                "DP-FTRL participation needs the opening or a release as the last entry"
            )
        if not (isinstance(run_id, str) and run_id):
            raise ParticipationRefusal(f"ledger head run_id={run_id!r}: not a run id")
        if not (index <= rounds):
            raise ParticipationRefusal(
                f"release index {index} > planned rounds {rounds} in the run config this "
                "client accepted: DP-FTRL's accounting covers T releases only"
            )
        with self._lock:
            history = self._load(run_id, client_id)
            if index in history:
                raise ParticipationRefusal(
                    f"release index {index} already trained for by this client "
                    f"({schema.describe()})"
                )
            why = schema.allows(history, index, rounds)
            if why is not None:
                raise ParticipationRefusal(
                    f"client {client_id} refuses DP-FTRL release {index}: {why}; the run's "
                    "epsilon holds only within the schema"
                )
            history.append(index)
            self._store(run_id, client_id, history)
        return index

    def count(self, run_id: str, client_id: int) -> int:
        return len(self._load(run_id, client_id))

    def _path(self, run_id: str, client_id: int) -> Path:
        assert self.directory is not None
        safe = "".join(c for c in run_id if c.isalnum() or c in "-_")[:64] or "run"
        return self.directory / f"{safe}-{int(client_id)}.json"

    def _load(self, run_id: str, client_id: int) -> list[int]:
        key = (run_id, client_id)
        if key not in self._memory and self.directory is not None:
            path = self._path(run_id, client_id)
            if path.exists():
                data = json.loads(path.read_text())
                self._memory[key] = [int(i) for i in data["releases"]]
        return list(self._memory.get(key, []))

    def _store(self, run_id: str, client_id: int, history: list[int]) -> None:
        self._memory[(run_id, client_id)] = list(history)
        if self.directory is None:
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(run_id, client_id)
        tmp = path.with_name(path.name + ".tmp")
        data = json.dumps({"run_id": run_id, "client_id": client_id, "releases": history})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
