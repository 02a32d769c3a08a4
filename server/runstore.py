"""The run directory: everything a user sees can be reproduced from it.

Layout:
  config.toml          the resolved configuration
  metrics.jsonl        one JSON line per round
  model.safetensors    the final global model
  summary.json         the run's summary
  checkpoint/          the last completed round (atomic replace), for resume
  privacy/ledger.jsonl every privacy release, hash-chained (DP runs)
  privacy/report.json  and report.html: what the run spent
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file + fsync + rename, so readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
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
        for sub in ("checkpoint", "privacy"):
            for f in (self.path / sub).glob("*") if (self.path / sub).is_dir() else []:
                f.unlink()

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint" / "state.pt"

    def write_config(self, toml_text: str) -> None:
        atomic_write_bytes(self.path / "config.toml", toml_text.encode())

    def append_metrics(self, record: dict[str, Any]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        out = []
        for line in self.metrics_path.read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
        return out

    def truncate_metrics(self, last_round: int) -> None:
        """Drop lines of rounds after the checkpoint (written before a crash)."""
        kept = [m for m in self.read_metrics() if m.get("round", 0) <= last_round]
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
        torch.save(state, buf)
        atomic_write_bytes(self.checkpoint_path, buf.getvalue())

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.checkpoint_path.exists():
            return None
        return torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
