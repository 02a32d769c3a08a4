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
import threading
from pathlib import Path

from fedveil.config import RunConfig
from fedveil.ops.private_file import read_private_record, replace_private_file
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
            history = _read_history(self._path(run_id, client_id), run_id, client_id)
            if history is not None:
                self._memory[key] = history
        return list(self._memory.get(key, []))

    def _store(self, run_id: str, client_id: int, history: list[int]) -> None:
        self._memory[(run_id, client_id)] = list(history)
        if self.directory is None:
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = json.dumps({"run_id": run_id, "client_id": client_id, "releases": history})
        replace_private_file(self._path(run_id, client_id), data.encode())


def _read_history(path: Path, run_id: str, client_id: int) -> list[int] | None:
    """The release indices recorded at `path` (None: no record); a file that cannot be
    trusted (unreadable, a link, not JSON, another run or client, anything but distinct
    whole numbers >= 1) is a refusal naming it, never an empty history: that would reopen
    the schema."""
    try:
        data = read_private_record(path)
    except ValueError as exc:
        raise ParticipationRefusal(
            f"{path}: DP-FTRL participation record {exc}; this client does not train for "
            "the run until it is restored or the run is over"
        ) from None
    if data is None:
        return None
    releases = data.get("releases")
    ok = (
        data.get("run_id") == run_id
        and data.get("client_id") == client_id
        and isinstance(releases, list)
        and all(type(i) is int and i >= 1 for i in releases)
        and len(set(releases)) == len(releases)
    )
    if not ok:
        raise ParticipationRefusal(
            f"{path}: not a DP-FTRL participation record of run {run_id!r}, client "
            f"{client_id} (releases must be distinct whole numbers >= 1); this client does "
            "not train for the run until it is restored or the run is over"
        )
    return list(releases)
