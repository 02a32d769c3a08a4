"""The coordinator starts without torch: the API, gateway and supervisor never need it, and
importing it (1-15 s on a loaded 2-core machine) delayed readiness. Runs that need it
(ServerApps) are processes of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from deployment_harness import Deployment

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast


def test_importing_the_coordinator_does_not_import_torch() -> None:
    code = (
        "import sys, fedveil.cli.deploy, fedveil.server.coordinator.launch; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"torch imported at start-up: {out.stdout}"


def test_a_ready_coordinator_has_not_loaded_torch(tmp_path: Path) -> None:
    dep = Deployment(tmp_path)
    try:
        dep.start_server()
        assert dep.server is not None
        maps = Path(f"/proc/{dep.server.pid}/maps").read_text()
        loaded = {line.split()[-1] for line in maps.splitlines() if "torch" in line}
        assert not loaded, f"the ready coordinator mapped {sorted(loaded)[:3]}"
    finally:
        dep.close()
