"""A service run's directory, shared by the HTTP service and the deployed ServerApp.

  state_dir/runs/<run id>/
    run.json          the service's record (status, attempts, stop requests)  [service writes]
    request.toml      the run config as submitted
    config.toml       the resolved run config
    deploy.json       deployment settings of the run ([deploy] table)
    secagg_roster.json  client identity keys (secagg.threat = 'malicious' only), as the
                      server's roster was when the run was submitted
    status.json       what the ServerApp is doing (phase, round, error)       [ServerApp writes]
    metrics.jsonl, checkpoint/, model.safetensors, summary.json   (RunStore layout)
    server.log        the ServerApp's log
    privacy/          DP ledger and reports, when DP is on

Each file has one writer, and every write is atomic (temp file + rename), so a
reader or a crash never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedveil.config import DeploySettings
from fedveil.server.engine.runstore import atomic_write_bytes

ROSTER_FILE = "secagg_roster.json"
SERVER_LOG = "server.log"
TAIL_BLOCK = 64 * 1024
# fullmatch, never match with `$`: `$` also matches before a trailing newline.
RUN_ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{2,63}")
ACTIVE = ("queued", "starting", "running")
FINAL = ("completed", "failed", "stopped")


def new_run_id() -> str:
    """Sortable by creation time, unguessable enough to not collide: 20261121-095300-1a2b3c."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except json.JSONDecodeError:
        # Only possible if something else wrote the file; our writes are atomic.
        return default


def tail_lines(path: Path, lines: int) -> str:
    """The last `lines` lines of a text file, reading blocks back from its end."""
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        data = b""
        while end > 0 and data.count(b"\n") <= lines:
            start = max(0, end - TAIL_BLOCK)
            f.seek(start)
            data = f.read(end - start) + data
            end = start
    return b"\n".join(data.splitlines()[-lines:]).decode("utf-8", "replace") + "\n"


def config_dp(run_dir: Path) -> str:
    """The run's dp.mechanism from its config.toml ('none' when absent or unreadable):
    for runs recorded before run.json carried it."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    try:
        values = tomllib.loads((run_dir / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return "none"
    return str(values.get("dp", {}).get("mechanism", "none"))


def write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())


class RunDir:
    def __init__(self, state_dir: Path, run_id: str) -> None:
        if not RUN_ID_RE.fullmatch(run_id):
            raise ValueError(f"run id {run_id!r}: not a fedveil run id")
        self.run_id = run_id
        self.path = Path(state_dir) / "runs" / run_id

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def exists(self) -> bool:
        return (self.path / "run.json").exists()

    # -- the service's record ------------------------------------------------
    def record(self) -> dict[str, Any]:
        return read_json(self.path / "run.json", {})

    def write_record(self, record: dict[str, Any]) -> None:
        write_json(self.path / "run.json", record)

    # -- the ServerApp's status ------------------------------------------------
    def status(self) -> dict[str, Any]:
        return read_json(self.path / "status.json", {})

    def write_status(self, **fields: Any) -> None:
        current = self.status()
        current.update(fields, updated_at=time.time(), pid=os.getpid())
        write_json(self.path / "status.json", current)

    def deploy(self) -> DeploySettings:
        return DeploySettings.from_dict(read_json(self.path / "deploy.json", {}))

    def metrics(self) -> list[dict[str, Any]]:
        out = []
        try:
            text = (self.path / "metrics.jsonl").read_text()
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line being appended right now; the next read gets it
        return out

    @contextlib.contextmanager
    def lock(self, timeout: float) -> Iterator[None]:
        """Exclusive use of the run directory by one ServerApp process.

        After a crash the kernel drops the old process's lock with the process, so
        a resumed ServerApp waits here until the previous one is really gone and
        can never apply a round on top of a still-running twin.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"run {self.run_id}: another ServerApp still holds the run "
                            f"directory after {timeout:.0f} s"
                        ) from None
                    time.sleep(0.2)
            yield
        finally:
            os.close(fd)
