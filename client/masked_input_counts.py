"""How many masked inputs a client sent in a run, kept where a restart cannot reset it.

Under distributed DP a client sends at most the masked inputs its run config allows
(client/own_share.py); the count is what that limit and the own-share-only epsilon are
computed from. A count kept in memory restarts at zero with the device, and a coordinator
could then compose a client's noise shares past the stated epsilon. So a device keeps it
in its state directory (`MaskedInputCounts(directory)`, set up by the edge node):

- one file per (run, client), `<directory>/<run>-<client>.json`, mode 0600 in a 0700
  folder, replaced atomically (fedveil/ops/private_file.py: the old count or the new one,
  never neither);
- `record(client, n)` writes the count BEFORE the masked input is computed: a crash
  after it has counted one that may not have left (conservative), never the reverse;
- fail closed: a count file that cannot be read, is not JSON, names another run or
  client, or holds anything but a whole number >= 0 is a refusal naming the file, never
  a count of zero. A missing file is a run this client has not sent to.

`MaskedInputCounts(None)` counts in memory (the in-process simulation: its clients live
as long as the run).
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

from fedveil.ops.private_file import read_private_record, replace_private_file
from fedveil.protocol.envelope import MessageError

COUNT_FIELD = "masked_inputs"
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class CountFileRefusal(MessageError):
    """A count file this client cannot trust: it refuses to send rather than start at 0."""


class MaskedInputCounts:
    """Every run's masked-input counts of this client (see the module doc)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory  # None: in memory (simulation)
        self._memory: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def for_run(self, run: str) -> RunMaskedInputs:
        if not _RUN_NAME.match(run):
            raise ValueError(f"run {run!r}: not a plain file name")
        return RunMaskedInputs(self, run)

    def path(self, run: str, client_id: int) -> Path:
        assert self.directory is not None
        return self.directory / f"{run}-{int(client_id)}.json"

    def get(self, run: str, client_id: int) -> int:
        with self._lock:
            return self._get(run, client_id)

    def record(self, run: str, client_id: int, count: int) -> None:
        """Keep `count` (durably on a device) before the masked input it counts leaves."""
        with self._lock:
            if self.directory is not None:
                self._write(run, client_id, count)
            self._memory[(run, client_id)] = count

    def _get(self, run: str, client_id: int) -> int:
        key = (run, client_id)
        if key not in self._memory and self.directory is not None:
            self._memory[key] = self._read(run, client_id)
        return self._memory.get(key, 0)

    def _read(self, run: str, client_id: int) -> int:
        path = self.path(run, client_id)
        try:
            data = read_private_record(path)
        except ValueError as exc:
            raise self._refusal(path, str(exc)) from None
        if data is None:
            return 0
        count = data.get(COUNT_FIELD, "(missing)")
        if data.get("run") != run or data.get("client_id") != client_id:
            raise self._refusal(
                path, f"names run {data.get('run')!r} client {data.get('client_id')!r}"
            )
        # bool is an int in Python: true would read as 1.
        if isinstance(count, bool) or not isinstance(count, int) or not (count >= 0):
            raise self._refusal(path, f"holds {COUNT_FIELD} = {count!r}, not a whole number >= 0")
        return count

    def _write(self, run: str, client_id: int, count: int) -> None:
        assert self.directory is not None
        path = self.path(run, client_id)
        data = {"run": run, "client_id": client_id, COUNT_FIELD: count}
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)  # mkdir's mode is masked by the umask
            replace_private_file(path, json.dumps(data, sort_keys=True).encode("ascii"))
        except OSError as exc:
            raise self._refusal(path, f"cannot be written ({exc})") from None

    @staticmethod
    def _refusal(path: Path, what: str) -> CountFileRefusal:
        return CountFileRefusal(
            f"this client's count of masked inputs sent in this run, {path}, {what}: it "
            "refuses to send another rather than count from zero (the run's participation "
            "limit and its epsilon against the coordinator rely on that count); an operator "
            "who knows the right count may restore the file"
        )


class RunMaskedInputs:
    """One run's view of a client's MaskedInputCounts: what an OwnShareAccount counts on."""

    def __init__(self, counts: MaskedInputCounts, run: str) -> None:
        self.counts, self.run = counts, run

    def get(self, client_id: int) -> int:
        return self.counts.get(self.run, client_id)

    def record(self, client_id: int, count: int) -> None:
        self.counts.record(self.run, client_id, count)
