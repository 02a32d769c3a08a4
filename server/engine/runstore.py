"""The run directory: everything a user sees can be reproduced from it.

Layout:
  config.toml          the resolved configuration
  metrics.jsonl        one JSON line per round
  model.safetensors    the final global model
  summary.json         the run's summary
  checkpoint/          the last completed round (atomic replace), for resume
  privacy/ledger.jsonl every privacy release, hash-chained (DP runs)
  privacy/report.json  and report.html: what the run spent
  private/             the operator's alone (dir 700, files 600), never served publicly:
    run.json           the run id and, under DP, the secret key cohorts are drawn from
    rounds.jsonl       each round's cohort, survivors, drop reasons, counts and aborts

A JSONL record is appended whole or not at all: a write that fails (a full disk) is
cut back to where it started before the error is raised. A line torn anyway (the
process killed mid-write) is the file's last line; reading drops it, and a resume
(`truncate_metrics`, `truncate_private`) rewrites the file without it and logs so.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("fedveil.run")


def atomic_write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write via a temp file + fsync + rename, so readers see old or new, never half.

    The file is created 600 (mkstemp); `mode` changes that before any byte is written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def append_record(path: Path, record: dict[str, Any], mode: int) -> None:
    """Append `record` as one JSON line, whole or not at all: if the write fails (ENOSPC,
    EDQUOT, EIO) the file is cut back to its length before, then the error is raised."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        start = os.fstat(fd).st_size  # one writer per file: where this record begins
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, start)  # frees space: succeeds on a full disk
            raise
    finally:
        os.close(fd)


def read_records(path: Path, *, say: bool = False) -> list[dict[str, Any]]:
    """The JSON lines of `path` ([] if absent). A last line without its newline, or that
    does not parse, is a torn append: dropped (logged if `say`). A bad line before the
    last is corruption and raises ValueError naming the line."""
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if number == len(lines) and not tail:
                tail = line  # the last line, newline and all, yet cut: torn
                break
            raise ValueError(f"{path}: line {number} is not JSON (not a torn last line)") from None
    if tail.strip() and say:
        log.warning(
            "%s: dropped a torn last line (%d bytes, no complete record): a write cut short "
            "by a full disk or a crash",
            path,
            len(tail.encode()),
        )
    return out


class RunStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def ledger_path(self) -> Path:
        return self.path / "privacy" / "ledger.jsonl"

    def clear(self) -> None:
        """Start a new run here: remove the files of a previous run (and only those)."""
        for name in ("metrics.jsonl", "summary.json", "model.safetensors", "partition.json"):
            (self.path / name).unlink(missing_ok=True)
        for sub in ("checkpoint", "privacy", "private"):
            for f in (self.path / sub).glob("*") if (self.path / sub).is_dir() else []:
                f.unlink()

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint" / "state.pt"

    def write_config(self, toml_text: str) -> None:
        atomic_write_bytes(self.path / "config.toml", toml_text.encode())

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_record(self.metrics_path, record, 0o644)

    def read_metrics(self) -> list[dict[str, Any]]:
        return read_records(self.metrics_path)

    def truncate_metrics(self, last_round: int) -> None:
        """Drop lines of rounds after the checkpoint (written before a crash), and a
        torn last line."""
        kept = [
            m for m in read_records(self.metrics_path, say=True) if m.get("round", 0) <= last_round
        ]
        atomic_write_bytes(
            self.metrics_path, "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept).encode()
        )

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_bytes(
            self.path / "summary.json",
            (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode(),
        )

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        import io

        buf = io.BytesIO()
        import torch  # here, not at import: the coordinator's API process never needs it

        torch.save(state, buf)
        # The checkpoint holds the sampler's state and the next cohort: operator-only.
        self.checkpoint_path.parent.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.checkpoint_path.parent, 0o700)
        atomic_write_bytes(self.checkpoint_path, buf.getvalue(), mode=0o600)

    # -- the operator's private files -------------------------------------
    @property
    def private_dir(self) -> Path:
        path = self.path / "private"
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        return path

    def run_identity(self) -> dict[str, str]:
        """This run's id and, under DP, the secret its cohorts are drawn from: made once
        (OS CSPRNG) and kept for resumes; only ever in private/run.json (mode 600)."""
        path = self.private_dir / "run.json"
        if path.exists():
            return dict(json.loads(path.read_text()))
        identity = {"run_id": secrets.token_hex(16), "cohort_key": secrets.token_hex(32)}
        atomic_write_bytes(path, json.dumps(identity).encode(), mode=0o600)
        return identity

    @property
    def private_rounds_path(self) -> Path:
        return self.private_dir / "rounds.jsonl"

    def append_private(self, record: dict[str, Any]) -> None:
        """One round's operator-only record (cohort, survivors, drop reasons, counts)."""
        append_record(self.private_rounds_path, record, 0o600)

    def read_private(self) -> list[dict[str, Any]]:
        return read_records(self.path / "private" / "rounds.jsonl")

    def truncate_private(self, last_round: int) -> None:
        """Drop private round lines after the checkpoint; charges stay (they were spent)."""
        if not (self.path / "private" / "rounds.jsonl").exists():
            return
        kept = [
            m
            for m in read_records(self.private_rounds_path, say=True)
            if m.get("round", 0) <= last_round or m.get("kind") == "charge"
        ]
        data = "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept).encode()
        atomic_write_bytes(self.private_rounds_path, data, mode=0o600)

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.checkpoint_path.exists():
            return None
        import torch

        return torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
