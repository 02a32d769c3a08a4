"""lineage.json in a run directory: the model a run started from (`fedveil simulate
--init-model`), so that registering the run finds its parent and composes epsilon."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedveil.server.engine.runstore import atomic_write_bytes

LINEAGE_FILE = "lineage.json"


def write_lineage(run_dir: Path, init_model: Path | None, parent: str | None) -> None:
    """Record the starting model (its SHA-256, and its registry reference if it came from
    one); a new run without one removes a previous run's record."""
    path = Path(run_dir) / LINEAGE_FILE
    if init_model is None:
        path.unlink(missing_ok=True)
        return
    record = {
        "init_model_sha256": hashlib.sha256(Path(init_model).read_bytes()).hexdigest(),
        "init_model": str(Path(init_model).resolve()),
        "parent": parent,
    }
    atomic_write_bytes(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), 0o644)


def read_lineage(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((Path(run_dir) / LINEAGE_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise ValueError(f"{Path(run_dir) / LINEAGE_FILE}: not valid JSON ({error})") from None
    return record if isinstance(record, dict) else None
