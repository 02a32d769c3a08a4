"""The device's witness store: the privacy-ledger heads this device was shown.

Under DP the coordinator puts its ledger's head (run_id, seq, hash, key_id,
signature) into each training request. The operator's signing key cannot stop the
operator from rewriting and re-signing its own ledger later, or from rolling it
back to an older signed prefix; heads kept on devices can. Each distinct head is
appended to `<state-dir>/witness/<run_id>.jsonl` (directory 700, file 600), which
`fedveil privacy verify RUN_DIR --witness FILE` checks against the chain.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from fedveil.privacy.dp.ledger import WITNESS_CONFIG_KEY, WITNESS_FIELDS, canonical_json

_SAFE_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: no "\n"
_HEX = re.compile(r"[0-9a-f]+")


class WitnessStore:
    """Appends each distinct ledger head to `directory/<run_id>.jsonl`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._seen: dict[str, set[str]] = {}  # run_id -> canonical heads on disk
        self._lock = threading.Lock()

    def path_for(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.jsonl"

    def record(self, head_json: str) -> bool:
        """Keep `head_json` (a JSON object of WITNESS_FIELDS); False if already kept.

        Raises ValueError for a malformed head (missing fields, bad types, a run id
        that is not a plain file name).
        """
        head = parse_head(head_json)
        line = canonical_json(head)
        with self._lock:
            seen = self._seen_for(head["run_id"])
            if line in seen:
                return False
            _append_private(self.directory, self.path_for(head["run_id"]), line + "\n")
            seen.add(line)
        return True

    def heads(self, run_id: str) -> list[dict[str, Any]]:
        path = self.path_for(run_id)
        if not path.exists():
            return []
        return [json.loads(raw) for raw in path.read_text().splitlines() if raw.strip()]

    def _seen_for(self, run_id: str) -> set[str]:
        if run_id not in self._seen:
            self._seen[run_id] = {canonical_json(head) for head in self.heads(run_id)}
        return self._seen[run_id]


def parse_head(head_json: str) -> dict[str, Any]:
    """The head as a dict with exactly WITNESS_FIELDS, checked field by field."""
    try:
        head = json.loads(head_json)
    except (TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"{WITNESS_CONFIG_KEY}: not valid JSON ({error})") from None
    if not isinstance(head, dict):
        raise ValueError(f"{WITNESS_CONFIG_KEY}: {head!r} is not a JSON object")
    missing = [name for name in WITNESS_FIELDS if name not in head]
    if missing:
        raise ValueError(f"{WITNESS_CONFIG_KEY}: missing fields {missing}")
    run_id, seq = head["run_id"], head["seq"]
    if not (isinstance(run_id, str) and _SAFE_RUN_ID.fullmatch(run_id)):
        raise ValueError(
            f"{WITNESS_CONFIG_KEY}: run_id={run_id!r} is invalid; allowed: 1-128 of "
            "[A-Za-z0-9._-], not starting with '.', '_' or '-'"
        )
    if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1):
        raise ValueError(f"{WITNESS_CONFIG_KEY}: seq={seq!r} is invalid; allowed: an integer >= 1")
    for name, length in (("hash", 64), ("key_id", 32), ("signature", 128)):
        value = head[name]
        if not (isinstance(value, str) and len(value) == length and _HEX.fullmatch(value)):
            raise ValueError(
                f"{WITNESS_CONFIG_KEY}: {name}={value!r} is invalid; allowed: {length} "
                "lowercase hex digits"
            )
    return {name: head[name] for name in WITNESS_FIELDS}


def _append_private(directory: Path, path: Path, text: str) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
        data = memoryview(text.encode("ascii"))
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)  # a witness the device lost on a crash witnesses nothing
    finally:
        os.close(fd)
